package io.github.decatonaio.bench.jvm;

import java.io.IOException;
import java.io.UncheckedIOException;

import com.fasterxml.jackson.annotation.JsonIgnoreProperties;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

/**
 * A benchmark task, {@code {"k": key id, "s": sequence, "d": simulated I/O in ms, "t": ...}},
 * decoded with Jackson; and the run's spec, the JSON the harness passes as the one argument.
 */
@JsonIgnoreProperties(ignoreUnknown = true)
public final class BenchTask {
    private static final ObjectMapper MAPPER = new ObjectMapper();

    public long k;
    public long s;
    public int d;
    public double t;

    /** Decode a record's value. */
    public static BenchTask parse(byte[] value) {
        try {
            return MAPPER.readValue(value, BenchTask.class);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** Decode the harness's spec (bench/workload.py RunSpec). */
    public static JsonNode spec(String json) throws IOException {
        return MAPPER.readTree(json);
    }
}
