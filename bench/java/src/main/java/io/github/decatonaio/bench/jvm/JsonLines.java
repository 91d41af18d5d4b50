package io.github.decatonaio.bench.jvm;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.Base64;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;

/**
 * JSON lines between a JVM program and Python: commands and tasks come in on standard
 * input, events go out on standard output, one object a line (logs go to standard error).
 * Writes from several threads never interleave.
 */
public final class JsonLines {
    private static final ObjectMapper MAPPER = new ObjectMapper();
    private static final PrintStream OUT =
            new PrintStream(new java.io.FileOutputStream(java.io.FileDescriptor.out), false,
                            StandardCharsets.UTF_8);

    private JsonLines() {}

    /** A new empty object. */
    public static ObjectNode object() {
        return MAPPER.createObjectNode();
    }

    /** An event object: {@code {"event": name}}. */
    public static ObjectNode event(String name) {
        ObjectNode node = object();
        node.put("event", name);
        return node;
    }

    /** Write one object as a line and flush it. */
    public static void emit(JsonNode node) {
        String line;
        try {
            line = MAPPER.writeValueAsString(node);
        } catch (JsonProcessingException e) {
            throw new IllegalStateException("cannot write JSON", e);
        }
        synchronized (OUT) {
            OUT.println(line);
            OUT.flush();
        }
    }

    /** Standard input, as UTF-8 lines. */
    public static BufferedReader input() {
        return new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    }

    /** Parse one input line; a line that is not a JSON object is a usage error. */
    public static JsonNode parse(String line) {
        try {
            JsonNode node = MAPPER.readTree(line);
            if (node == null || !node.isObject()) {
                throw new Args.UsageException("input line is not a JSON object: " + line);
            }
            return node;
        } catch (IOException e) {
            throw new Args.UsageException("input line is not JSON (" + e.getMessage() + "): " + line);
        }
    }

    /** Bytes as base64, or null. */
    public static String base64(byte[] bytes) {
        return bytes == null ? null : Base64.getEncoder().encodeToString(bytes);
    }
}
