package io.github.decatonaio.bench.interop;

import java.io.BufferedReader;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.CompletableFuture;

import org.apache.kafka.clients.producer.ProducerConfig;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import com.linecorp.decaton.client.DecatonClient;
import com.linecorp.decaton.client.DecatonClient.TaskMetadata;
import com.linecorp.decaton.client.PutTaskResult;
import com.linecorp.decaton.protocol.Sample.HelloTask;

import io.github.decatonaio.bench.jvm.Args;
import io.github.decatonaio.bench.jvm.JsonLines;

/**
 * Puts tasks with Decaton's {@link DecatonClient}: one JSON line per task on standard input,
 * {@code {"key": "k" or null, "task": {"name", "age", "text"}, "timestamp_ms": optional,
 * "scheduled_time_ms": optional, "partition": optional}}.
 *
 * <p>A line with none of the optional fields goes through {@code put(key, task)}, one with
 * only a timestamp through {@code put(key, task, timestamp)}, any other through
 * {@code put(key, task, TaskMetadata, partition)}: each of the client's ways of writing
 * metadata is used. {@code --legacy} turns on the client's deprecated
 * {@code produceInOldTaskRequest}: the pre-9 {@code DecatonTaskRequest} wrapper, no header.
 *
 * <p>Once standard input ends, writes one line per task in input order,
 * {@code {"event": "put", "partition": p, "offset": o}}, then exits.
 */
final class Produce {
    private Produce() {}

    @SuppressWarnings("deprecation") // produceInOldTaskRequest: the legacy format on purpose
    static void run(Args args) throws Exception {
        Properties config = new Properties();
        config.setProperty(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, args.required("bootstrap-servers"));
        config.setProperty(ProducerConfig.CLIENT_ID_CONFIG, "decaton-interop-producer");
        if (args.flag("no-idempotence")) {
            config.setProperty(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "false");
        }
        List<CompletableFuture<PutTaskResult>> puts = new ArrayList<>();
        try (DecatonClient<HelloTask> client =
                     DecatonClient.producing(args.required("topic"), HelloTask::toByteArray)
                                  .applicationId(args.get("application-id", "decaton-interop"))
                                  .instanceId(args.get("instance-id", "decaton-interop-1"))
                                  .producerConfig(config)
                                  .produceInOldTaskRequest(args.flag("legacy"))
                                  .build()) {
            BufferedReader in = JsonLines.input();
            for (String line = in.readLine(); line != null; line = in.readLine()) {
                if (!line.isBlank()) {
                    puts.add(put(client, JsonLines.parse(line)));
                }
            }
            for (CompletableFuture<PutTaskResult> put : puts) {
                JsonLines.emit(location(put.get().id()));
            }
        }
    }

    private static CompletableFuture<PutTaskResult> put(DecatonClient<HelloTask> client, JsonNode line) {
        JsonNode keyNode = line.get("key");
        String key = keyNode == null || keyNode.isNull() ? null : keyNode.asText();
        HelloTask task = HelloTasks.fromJson(line.get("task"));
        Long timestamp = optionalLong(line, "timestamp_ms");
        Long scheduled = optionalLong(line, "scheduled_time_ms");
        Long partition = optionalLong(line, "partition");
        if (scheduled == null && partition == null) {
            return timestamp == null ? client.put(key, task) : client.put(key, task, timestamp);
        }
        TaskMetadata metadata = TaskMetadata.builder().timestamp(timestamp).scheduledTime(scheduled).build();
        return client.put(key, task, metadata, partition == null ? null : partition.intValue());
    }

    private static Long optionalLong(JsonNode line, String field) {
        JsonNode node = line.get(field);
        return node == null || node.isNull() ? null : node.asLong();
    }

    /** {@code PutTaskResult.id()} is {@code <topic>-<partition>-<offset>}. */
    private static ObjectNode location(String id) {
        int offsetAt = id.lastIndexOf('-');
        int partitionAt = id.lastIndexOf('-', offsetAt - 1);
        ObjectNode node = JsonLines.event("put");
        node.put("partition", Integer.parseInt(id.substring(partitionAt + 1, offsetAt)));
        node.put("offset", Long.parseLong(id.substring(offsetAt + 1)));
        return node;
    }
}
