package io.github.decatonaio.bench.jvm;

import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;

/**
 * Command-line options of the form {@code --name value} and {@code --flag}.
 *
 * <p>A bad option is a usage error: {@link UsageException} says which, and the program
 * exits 2 with that one line.
 */
public final class Args {
    private final Map<String, String> values = new HashMap<>();
    private final Set<String> flags = new HashSet<>();

    private Args() {}

    /** A usage error, reported as one line. */
    public static final class UsageException extends RuntimeException {
        private static final long serialVersionUID = 1L;

        public UsageException(String message) {
            super(message);
        }
    }

    /**
     * Parse {@code argv} from index {@code from} on.
     *
     * @param flagNames the options that take no value
     */
    public static Args parse(String[] argv, int from, Set<String> flagNames) {
        Args args = new Args();
        for (int i = from; i < argv.length; i++) {
            String arg = argv[i];
            if (!arg.startsWith("--") || arg.length() == 2) {
                throw new UsageException("unexpected argument '" + arg + "': options are --name value");
            }
            String name = arg.substring(2);
            if (flagNames.contains(name)) {
                args.flags.add(name);
            } else if (i + 1 < argv.length) {
                args.values.put(name, argv[++i]);
            } else {
                throw new UsageException("option --" + name + " needs a value");
            }
        }
        return args;
    }

    /** The value of a required option. */
    public String required(String name) {
        String value = values.get(name);
        if (value == null || value.isEmpty()) {
            throw new UsageException("option --" + name + " is required");
        }
        return value;
    }

    /** The value of an option, or {@code fallback} when it is absent. */
    public String get(String name, String fallback) {
        return values.getOrDefault(name, fallback);
    }

    /** The value of an option as a long, or {@code fallback} when it is absent. */
    public long getLong(String name, long fallback) {
        String value = values.get(name);
        if (value == null) {
            return fallback;
        }
        try {
            return Long.parseLong(value);
        } catch (NumberFormatException e) {
            throw new UsageException("option --" + name + " must be an integer, got '" + value + "'");
        }
    }

    /** Whether a flag was given. */
    public boolean flag(String name) {
        return flags.contains(name);
    }

    /** Whether an option was given a value. */
    public boolean has(String name) {
        return values.containsKey(name);
    }
}
