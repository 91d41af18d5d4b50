package io.github.decatonaio.bench.interop;

import java.util.Set;

import io.github.decatonaio.bench.jvm.Args;

/**
 * Decaton's own client and processor, driven from Python to prove wire compatibility.
 *
 * <pre>
 * produce   --bootstrap-servers B --topic T [--application-id A] [--instance-id I] [--legacy]
 *           [--no-idempotence]
 *           tasks as JSON lines on standard input; see {@link Produce}
 * subscribe --bootstrap-servers B --topic T --group G [--body hello|bytes]
 *           [--retry-backoff-ms MS --retry-key-prefix P] [--legacy-parse-fallback]
 *           [--no-idempotence]
 *           runs a ProcessorSubscription until standard input closes; see {@link Subscribe}
 * </pre>
 *
 * {@code --no-idempotence} turns the producers' idempotence off, for a broker without it.
 *
 * <p>Exit codes: 0 done, 1 failure (a stack trace on standard error), 2 usage.
 */
public final class InteropDriver {
    private InteropDriver() {}

    public static void main(String[] argv) {
        try {
            if (argv.length == 0) {
                throw new Args.UsageException("usage: InteropDriver produce|subscribe --option value ...");
            }
            switch (argv[0]) {
                case "produce":
                    Produce.run(Args.parse(argv, 1, Set.of("legacy", "no-idempotence")));
                    break;
                case "subscribe":
                    Subscribe.run(Args.parse(argv, 1, Set.of("legacy-parse-fallback", "no-idempotence")));
                    break;
                default:
                    throw new Args.UsageException("unknown command '" + argv[0] + "': produce or subscribe");
            }
        } catch (Args.UsageException e) {
            System.err.println("InteropDriver: " + e.getMessage());
            System.exit(2);
        } catch (Exception e) {
            e.printStackTrace();
            System.exit(1);
        }
        System.exit(0);
    }
}
