// The real Flyway, run on a dlock history: services/migrator/tests/flyway.rs checks with it that
// Flyway accepts what dlock-migrate wrote and that dlock-migrate accepts what Flyway wrote.
//
// Usage: FlywayCheck JDBC_URL USER PASSWORD TABLE COMMAND LOCATION...
//   COMMAND   validate | migrate | info
//   LOCATION  a folder of V<n>__ / R__ files (several: one history from several locations)
//
// Exits 0 on success; on failure prints Flyway's own message to stderr and exits 1. `info` prints
// one line per migration Flyway knows (resolved or applied), tab-separated, after a marker:
//   MIGRATION <version or empty> <description> <script> <checksum or empty> <state> <type>
// so that a test can compare Flyway's checksums with dlock-migrate's file by file.

import java.util.Arrays;

import org.flywaydb.core.Flyway;
import org.flywaydb.core.api.FlywayException;
import org.flywaydb.core.api.MigrationInfo;

public final class FlywayCheck {
    public static void main(String[] args) {
        if (args.length < 6) {
            System.err.println("usage: FlywayCheck JDBC_URL USER PASSWORD TABLE validate|migrate|info LOCATION...");
            System.exit(2);
        }
        String[] locations = Arrays.stream(args, 5, args.length)
                .map(dir -> "filesystem:" + dir)
                .toArray(String[]::new);
        Flyway flyway = Flyway.configure()
                .dataSource(args[0], args[1], args[2])
                .table(args[3])
                .locations(locations)
                // A history with nothing pending is what is validated; pending files are not an error.
                .ignoreMigrationPatterns("*:pending")
                .cleanDisabled(true)
                .load();
        try {
            switch (args[4]) {
                case "validate" -> flyway.validate();
                case "migrate" -> {
                    var result = flyway.migrate();
                    System.out.println("MIGRATED\t" + result.migrationsExecuted);
                }
                case "info" -> {
                    for (MigrationInfo m : flyway.info().all()) {
                        System.out.println(String.join("\t",
                                "MIGRATION",
                                m.getVersion() == null ? "" : m.getVersion().getVersion(),
                                m.getDescription(),
                                m.getScript(),
                                m.getChecksum() == null ? "" : m.getChecksum().toString(),
                                m.getState().name(),
                                m.getType().name()));
                    }
                }
                default -> {
                    System.err.println("unknown command " + args[4] + "; expected validate, migrate or info");
                    System.exit(2);
                }
            }
        } catch (FlywayException e) {
            System.err.println("FLYWAY ERROR: " + e.getMessage());
            System.exit(1);
        }
    }
}
