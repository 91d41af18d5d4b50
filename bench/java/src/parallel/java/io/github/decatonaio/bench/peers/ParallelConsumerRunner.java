package io.github.decatonaio.bench.peers;

import java.time.Duration;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

import com.fasterxml.jackson.databind.JsonNode;

import io.confluent.parallelconsumer.ParallelConsumerOptions;
import io.confluent.parallelconsumer.ParallelConsumerOptions.CommitMode;
import io.confluent.parallelconsumer.ParallelConsumerOptions.ProcessingOrder;
import io.confluent.parallelconsumer.ParallelStreamProcessor;

import io.github.decatonaio.bench.jvm.BenchTask;
import io.github.decatonaio.bench.jvm.TaskFacts;

/**
 * The benchmark's parallel-consumer contender: Confluent's parallel consumer with KEY
 * ordering (a key's records one at a time, keys concurrently), periodic asynchronous
 * commits, and the shared task body (decode, simulated I/O as a sleep in its worker
 * thread, facts), until the process is stopped.
 *
 * <p>Options: {@code max_concurrency} (its worker threads, default 16).
 */
public final class ParallelConsumerRunner {
    private ParallelConsumerRunner() {}

    public static void main(String[] argv) throws Exception {
        JsonNode spec = BenchTask.spec(argv[0]);
        TaskFacts facts = TaskFacts.open(spec.path("facts_dir").asText());
        int sessionMs = spec.path("session_timeout_ms").asInt(10_000);
        Properties props = new Properties();
        props.setProperty(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, spec.path("bootstrap").asText());
        props.setProperty(ConsumerConfig.GROUP_ID_CONFIG, spec.path("group").asText());
        props.setProperty(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.setProperty(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.setProperty(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, Integer.toString(sessionMs));
        props.setProperty(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, Integer.toString(Math.max(100, sessionMs / 10)));
        KafkaConsumer<byte[], byte[]> consumer =
                new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer());
        ParallelConsumerOptions<byte[], byte[]> options =
                ParallelConsumerOptions.<byte[], byte[]>builder()
                                       .ordering(ProcessingOrder.KEY)
                                       .maxConcurrency(spec.path("options").path("max_concurrency").asInt(16))
                                       .commitMode(CommitMode.PERIODIC_CONSUMER_ASYNCHRONOUS)
                                       .consumer(consumer)
                                       .build();
        ParallelStreamProcessor<byte[], byte[]> processor = ParallelStreamProcessor.createEosStreamProcessor(options);
        processor.subscribe(List.of(spec.path("topic").asText()));
        processor.poll(context -> {
            ConsumerRecord<byte[], byte[]> record = context.getSingleConsumerRecord();
            long start = TaskFacts.nowNs();
            BenchTask task = BenchTask.parse(record.value());
            if (task.d > 0) {
                try {
                    Thread.sleep(task.d);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new IllegalStateException(e);
                }
            }
            facts.add(task.k, record.partition(), record.offset(), start, TaskFacts.nowNs());
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            processor.close();
            facts.flush();
        }));
        Thread.sleep(Duration.ofDays(365).toMillis());
    }
}
