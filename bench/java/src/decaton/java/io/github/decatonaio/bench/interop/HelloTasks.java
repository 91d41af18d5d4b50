package io.github.decatonaio.bench.interop;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import com.linecorp.decaton.protocol.Sample.HelloTask;

import io.github.decatonaio.bench.jvm.JsonLines;

/**
 * Task bodies: Decaton's own sample protobuf message {@code HelloTask} (name = 1, age = 2,
 * text = 3), generated code shipped in decaton-protocol, as JSON objects.
 */
final class HelloTasks {
    private HelloTasks() {}

    static HelloTask fromJson(JsonNode node) {
        if (node == null || !node.isObject()) {
            throw new IllegalArgumentException("a task is a JSON object {name, age, text}, got " + node);
        }
        return HelloTask.newBuilder()
                        .setName(node.path("name").asText(""))
                        .setAge(node.path("age").asInt(0))
                        .setText(node.path("text").asText(""))
                        .build();
    }

    static ObjectNode toJson(HelloTask task) {
        ObjectNode node = JsonLines.object();
        node.put("name", task.getName());
        node.put("age", task.getAge());
        node.put("text", task.getText());
        return node;
    }

    /** Parse a body; protobuf's exception type is relocated in Decaton's jar, hence Exception. */
    static HelloTask parse(byte[] bytes) {
        try {
            return HelloTask.parseFrom(bytes);
        } catch (Exception e) {
            throw new IllegalArgumentException("not a HelloTask: " + e.getMessage(), e);
        }
    }
}
