package io.github.decatonaio.bench.interop;

import java.io.BufferedReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.header.Header;
import org.slf4j.MDC;

import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import com.linecorp.decaton.common.Deserializer;
import com.linecorp.decaton.processor.DecatonProcessor;
import com.linecorp.decaton.processor.LoggingContext;
import com.linecorp.decaton.processor.ProcessingContext;
import com.linecorp.decaton.processor.TaskMetadata;
import com.linecorp.decaton.processor.runtime.ProcessorProperties;
import com.linecorp.decaton.processor.runtime.ProcessorSubscription;
import com.linecorp.decaton.processor.runtime.ProcessorsBuilder;
import com.linecorp.decaton.processor.runtime.Property;
import com.linecorp.decaton.processor.runtime.RetryConfig;
import com.linecorp.decaton.processor.runtime.StaticPropertySupplier;
import com.linecorp.decaton.processor.runtime.SubscriptionBuilder;
import com.linecorp.decaton.protocol.Sample.HelloTask;

import io.github.decatonaio.bench.jvm.Args;
import io.github.decatonaio.bench.jvm.JsonLines;

/**
 * Runs a Decaton {@link ProcessorSubscription} on one topic and writes what it processed,
 * one JSON line per task:
 *
 * <pre>
 * {"event": "task", "topic", "partition", "offset", "key" (printable ASCII or null),
 *  "key_b64", "task": {"name", "age", "text"} (--body hello) or "body_b64" (--body bytes),
 *  "metadata": {"timestamp_ms", "source_application_id", "source_instance_id",
 *               "retry_count", "scheduled_time_ms"},
 *  "headers": [[name, base64 value], ...], "processed_at_ms", "retried",
 *  "started_ns", "ended_ns" (wall clock, for overlaps with other processes)}
 * </pre>
 *
 * Also {@code {"event": "state", "state": ...}} at each change of the subscription's state.
 *
 * <p>With {@code --retry-backoff-ms}, Decaton's retry queueing is on (retry topic
 * {@code <topic>-retry}); a task whose key starts with {@code --retry-key-prefix} and
 * whose retry count is 0 is retried with {@code context.retry()}.
 * {@code --legacy-parse-fallback} sets {@code decaton.legacy.parse.fallback.enabled};
 * {@code --sleep-ms} makes each task sleep that long (its processing time);
 * {@code --commit-interval-ms} sets {@code decaton.commit.interval.ms}.
 * The subscription closes when standard input ends, then {@code {"event": "closed"}}.
 */
final class Subscribe {
    private Subscribe() {}

    static void run(Args args) throws Exception {
        String topic = args.required("topic");
        String group = args.required("group");
        Properties consumer = new Properties();
        consumer.setProperty(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args.required("bootstrap-servers"));
        consumer.setProperty(ConsumerConfig.GROUP_ID_CONFIG, group);
        consumer.setProperty(ConsumerConfig.CLIENT_ID_CONFIG, "decaton-interop-" + group);
        consumer.setProperty(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        consumer.setProperty(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "6000");
        consumer.setProperty(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "500");
        // A retry topic created just before the start may be missing from the first
        // metadata: without a quick refresh it would be assigned only after 5 minutes.
        consumer.setProperty(ConsumerConfig.METADATA_MAX_AGE_CONFIG, "1000");

        String body = args.get("body", "hello");
        Deserializer<Object> deserializer;
        if ("hello".equals(body)) {
            deserializer = HelloTasks::parse;
        } else if ("bytes".equals(body)) {
            deserializer = bytes -> bytes;
        } else {
            throw new Args.UsageException("--body is hello or bytes, got '" + body + "'");
        }
        String retryPrefix = args.get("retry-key-prefix", null);

        List<Property<?>> properties = new ArrayList<>();
        properties.add(Property.ofStatic(ProcessorProperties.CONFIG_LEGACY_PARSE_FALLBACK_ENABLED,
                                         args.flag("legacy-parse-fallback")));
        if (args.has("commit-interval-ms")) {
            properties.add(Property.ofStatic(ProcessorProperties.CONFIG_COMMIT_INTERVAL_MS,
                                             args.getLong("commit-interval-ms", 1000)));
        }
        long sleepMs = args.getLong("sleep-ms", 0);
        SubscriptionBuilder builder =
                SubscriptionBuilder.newBuilder(group)
                                   .consumerConfig(consumer)
                                   .addProperties(StaticPropertySupplier.of(properties))
                                   .stateListener(state -> {
                                       ObjectNode event = JsonLines.event("state");
                                       event.put("state", state.name());
                                       JsonLines.emit(event);
                                   })
                                   .processorsBuilder(ProcessorsBuilder.consuming(topic, deserializer)
                                                                       .thenProcess(recorder(retryPrefix, sleepMs)));
        if (args.has("retry-backoff-ms")) {
            Duration backoff = Duration.ofMillis(args.getLong("retry-backoff-ms", 0));
            RetryConfig.RetryConfigBuilder retry = RetryConfig.builder().backoff(backoff);
            if (args.flag("no-idempotence")) {
                Properties producer = new Properties();
                producer.setProperty(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, args.required("bootstrap-servers"));
                producer.setProperty(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "false");
                producer.setProperty(ProducerConfig.LINGER_MS_CONFIG, "100");
                retry.producerConfig(producer);
            }
            builder.enableRetry(retry.build());
        } else if (retryPrefix != null) {
            throw new Args.UsageException("--retry-key-prefix needs --retry-backoff-ms (retries on)");
        }
        ProcessorSubscription subscription = builder.buildAndStart();
        BufferedReader in = JsonLines.input();
        while (in.readLine() != null) {
            // Runs until standard input ends.
        }
        subscription.close();
        JsonLines.emit(JsonLines.event("closed"));
    }

    private static long wallNanos() {
        Instant now = Instant.now();
        return now.getEpochSecond() * 1_000_000_000L + now.getNano();
    }

    private static DecatonProcessor<Object> recorder(String retryPrefix, long sleepMs) {
        return (ProcessingContext<Object> context, Object task) -> {
            ObjectNode event = JsonLines.event("task");
            event.put("started_ns", wallNanos());
            if (sleepMs > 0) {
                Thread.sleep(sleepMs);
            }
            try (LoggingContext ignored = context.loggingContext()) {
                // Decaton's MDC is the one place its processor API names the record.
                event.put("topic", MDC.get(LoggingContext.TOPIC_KEY));
                event.put("partition", Integer.parseInt(MDC.get(LoggingContext.PARTITION_KEY)));
                event.put("offset", Long.parseLong(MDC.get(LoggingContext.OFFSET_KEY)));
            }
            byte[] key = context.key();
            event.put("key", printableAscii(key));
            event.put("key_b64", JsonLines.base64(key));
            if (task instanceof HelloTask) {
                event.set("task", HelloTasks.toJson((HelloTask) task));
            } else {
                event.put("body_b64", JsonLines.base64((byte[]) task));
            }
            TaskMetadata meta = context.metadata();
            ObjectNode metadata = event.putObject("metadata");
            metadata.put("timestamp_ms", meta.timestampMillis());
            metadata.put("source_application_id", meta.sourceApplicationId());
            metadata.put("source_instance_id", meta.sourceInstanceId());
            metadata.put("retry_count", meta.retryCount());
            metadata.put("scheduled_time_ms", meta.scheduledTimeMillis());
            ArrayNode headers = event.putArray("headers");
            for (Header header : context.headers()) {
                headers.addArray().add(header.key()).add(JsonLines.base64(header.value()));
            }
            event.put("processed_at_ms", System.currentTimeMillis());
            boolean retry = retryPrefix != null && key != null && meta.retryCount() == 0
                            && new String(key, StandardCharsets.ISO_8859_1).startsWith(retryPrefix);
            event.put("retried", retry);
            if (retry) {
                context.retry();
            }
            event.put("ended_ns", wallNanos());
            JsonLines.emit(event);
        };
    }

    private static String printableAscii(byte[] key) {
        if (key == null) {
            return null;
        }
        for (byte b : key) {
            if (b < 32 || b > 126) {
                return null;
            }
        }
        return new String(key, StandardCharsets.US_ASCII);
    }
}
