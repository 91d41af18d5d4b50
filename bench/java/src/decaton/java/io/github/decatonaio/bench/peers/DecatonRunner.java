package io.github.decatonaio.bench.peers;

import java.time.Duration;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.slf4j.MDC;

import com.fasterxml.jackson.databind.JsonNode;

import com.linecorp.decaton.common.Deserializer;
import com.linecorp.decaton.processor.Completion;
import com.linecorp.decaton.processor.DecatonProcessor;
import com.linecorp.decaton.processor.LoggingContext;
import com.linecorp.decaton.processor.runtime.ProcessorProperties;
import com.linecorp.decaton.processor.runtime.ProcessorSubscription;
import com.linecorp.decaton.processor.runtime.ProcessorsBuilder;
import com.linecorp.decaton.processor.runtime.Property;
import com.linecorp.decaton.processor.runtime.StaticPropertySupplier;
import com.linecorp.decaton.processor.runtime.SubPartitionRuntime;
import com.linecorp.decaton.processor.runtime.SubscriptionBuilder;

import io.github.decatonaio.bench.jvm.BenchTask;
import io.github.decatonaio.bench.jvm.TaskFacts;

/**
 * The benchmark's Decaton contender: one {@link ProcessorSubscription} on the task topic,
 * the shared task body (decode, simulated I/O, facts), until the process is stopped.
 *
 * <p>Options (the spec's {@code options}): {@code runtime} ({@code THREAD_POOL}, or
 * {@code VIRTUAL_THREAD} for the contender {@code decaton-virtual}; Java 21+),
 * {@code concurrency} ({@code decaton.partition.concurrency}), {@code max_pending}
 * ({@code decaton.max.pending.records}) and {@code io}: {@code sleep} (the processor
 * sleeps, as blocking I/O does) or {@code async} (a deferred completion completed by a
 * timer, as asynchronous I/O does). The partition and offset of a task come from
 * Decaton's logging context, the one place its processor API names the record.
 */
public final class DecatonRunner {
    private DecatonRunner() {}

    public static void main(String[] argv) throws Exception {
        JsonNode spec = BenchTask.spec(argv[0]);
        JsonNode options = spec.path("options");
        boolean virtual = "decaton-virtual".equals(spec.path("contender").asText());
        String runtime = options.path("runtime").asText(virtual ? "VIRTUAL_THREAD" : "THREAD_POOL");
        TaskFacts facts = TaskFacts.open(spec.path("facts_dir").asText());
        int sessionMs = spec.path("session_timeout_ms").asInt(10_000);

        Properties consumer = new Properties();
        consumer.setProperty(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, spec.path("bootstrap").asText());
        consumer.setProperty(ConsumerConfig.GROUP_ID_CONFIG, spec.path("group").asText());
        consumer.setProperty(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        consumer.setProperty(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, Integer.toString(sessionMs));
        consumer.setProperty(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, Integer.toString(Math.max(100, sessionMs / 10)));

        List<Property<?>> properties = List.of(
                Property.ofStatic(ProcessorProperties.CONFIG_PARTITION_CONCURRENCY,
                                  options.path("concurrency").asInt(1)),
                Property.ofStatic(ProcessorProperties.CONFIG_MAX_PENDING_RECORDS,
                                  options.path("max_pending").asInt(10_000)));
        ScheduledExecutorService timer =
                "async".equals(options.path("io").asText("sleep")) ? Executors.newScheduledThreadPool(2) : null;

        DecatonProcessor<BenchTask> processor = (context, task) -> {
            long start = TaskFacts.nowNs();
            int partition;
            long offset;
            try (LoggingContext ignored = context.loggingContext()) {
                partition = Integer.parseInt(MDC.get(LoggingContext.PARTITION_KEY));
                offset = Long.parseLong(MDC.get(LoggingContext.OFFSET_KEY));
            }
            if (task.d > 0 && timer != null) {
                Completion completion = context.deferCompletion();
                timer.schedule(() -> {
                    facts.add(task.k, partition, offset, start, TaskFacts.nowNs());
                    completion.complete();
                }, task.d, TimeUnit.MILLISECONDS);
                return;
            }
            if (task.d > 0) {
                Thread.sleep(task.d);
            }
            facts.add(task.k, partition, offset, start, TaskFacts.nowNs());
        };
        Deserializer<BenchTask> decode = BenchTask::parse;
        ProcessorSubscription subscription =
                SubscriptionBuilder.newBuilder(spec.path("group").asText())
                                   .consumerConfig(consumer)
                                   .addProperties(StaticPropertySupplier.of(properties))
                                   .subPartitionRuntime(SubPartitionRuntime.valueOf(runtime))
                                   .processorsBuilder(ProcessorsBuilder.consuming(spec.path("topic").asText(), decode)
                                                                       .thenProcess(processor))
                                   .buildAndStart();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                subscription.close();
            } catch (Exception e) {
                // stopping anyway
            }
            facts.flush();
        }));
        Thread.sleep(Duration.ofDays(365).toMillis());
    }
}
