package io.github.decatonaio.bench.jvm;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.time.Instant;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

/**
 * The benchmark's per-task facts, as every contender writes them: one record per finished
 * task of five little-endian 64-bit integers, {@code key, partition, offset, start_ns,
 * end_ns} (wall-clock nanoseconds), appended to {@code <facts_dir>/<pid>.facts}.
 *
 * <p>Records are buffered and written when the buffer fills and every 200 ms.
 */
public final class TaskFacts {
    private static final int RECORD = 5 * Long.BYTES;
    private final FileChannel channel;
    private final ByteBuffer buffer = ByteBuffer.allocate(RECORD * 4096).order(ByteOrder.LITTLE_ENDIAN);

    private TaskFacts(FileChannel channel) {
        this.channel = channel;
    }

    /** Open the facts file of this process in {@code directory}; flushes every 200 ms. */
    public static TaskFacts open(String directory) throws IOException {
        Path path = Path.of(directory, ProcessHandle.current().pid() + ".facts");
        TaskFacts facts = new TaskFacts(FileChannel.open(
                path, StandardOpenOption.CREATE, StandardOpenOption.WRITE, StandardOpenOption.APPEND));
        ScheduledExecutorService timer = Executors.newSingleThreadScheduledExecutor(r -> {
            Thread thread = new Thread(r, "facts-flush");
            thread.setDaemon(true);
            return thread;
        });
        timer.scheduleAtFixedRate(facts::flush, 200, 200, TimeUnit.MILLISECONDS);
        return facts;
    }

    /** Wall-clock nanoseconds, the clock of every contender's facts. */
    public static long nowNs() {
        Instant now = Instant.now();
        return now.getEpochSecond() * 1_000_000_000L + now.getNano();
    }

    /** Record one finished task. */
    public synchronized void add(long key, int partition, long offset, long startNs, long endNs) {
        if (buffer.remaining() < RECORD) {
            flushLocked();
        }
        buffer.putLong(key).putLong(partition).putLong(offset).putLong(startNs).putLong(endNs);
    }

    /** Write what is buffered. */
    public synchronized void flush() {
        flushLocked();
    }

    private void flushLocked() {
        buffer.flip();
        try {
            while (buffer.hasRemaining()) {
                channel.write(buffer);
            }
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        } finally {
            buffer.clear();
        }
    }
}
