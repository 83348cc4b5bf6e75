//! The floors under the dlock rows of `bench lock`: the least CPU a cycle on distinct keys can
//! cost, summed from parts measured in the same run, against the etcd Mutex's rate.

use super::meter::Phase;

/// The row of the HTTP hop alone ([`super::hop`]).
pub(super) const HOP_ROW: &str = "HTTP hop alone (no store), distinct";

/// For each client count with a Mutex row: the fewest CPU-seconds a dlock cycle on distinct keys
/// can cost, and so the most cycles/s `cores` allow, against the Mutex's rate; then what the dlock
/// row spent above its floor, by process. A floor is a sum of parts measured in the same run, each
/// one a dlock cycle cannot do without: the HTTP hop alone (its generator and its server), one
/// signature (`sign_secs`), and the store's work — on PostgreSQL what lockdb spent per dlock cycle,
/// on etcd what etcd spent per Mutex cycle (the least a grant and a release can cost it). No row
/// keeps every core busy, so the real bound is lower still.
pub(super) fn floors(
    rows: &[(u32, Phase)],
    dlock_rows: [&str; 2],
    sign_secs: f64,
    cores: f64,
) -> Vec<String> {
    let find = |clients: u32, name: &str| {
        rows.iter()
            .find(|(c, p)| *c == clients && p.name == name)
            .map(|(_, p)| p)
    };
    let ms = |secs: f64| secs * 1e3;
    let mut counts: Vec<u32> = rows.iter().map(|(c, _)| *c).collect();
    counts.dedup();
    let mut lines = Vec::new();
    for clients in counts {
        let (Some(hop), Some(mutex)) = (find(clients, HOP_ROW), find(clients, "etcd Mutex, distinct")) else {
            continue;
        };
        let (Some(hop_cpu), Some(mutex_cpu)) = (hop.cpu_per_cycle(None), mutex.cpu_per_cycle(None)) else {
            continue;
        };
        let hop_part = hop_cpu + sign_secs;
        lines.push(format!(
            "{clients} clients: the Mutex {:.0} cycles/s at {:.3} ms CPU per cycle; the HTTP hop and a signature {:.3} ms",
            mutex.per_sec(),
            ms(mutex_cpu),
            ms(hop_part)
        ));
        // The store's part: lockdb as the dlock row measured it (so nothing of lockdb's is above
        // the floor: not printed); etcd as the Mutex row did.
        let pg = find(clients, dlock_rows[0]);
        let stores = [
            (
                "postgres",
                pg,
                pg.and_then(|p| p.cpu_per_cycle(Some("postgres"))),
                "lockdb per dlock cycle",
                false,
            ),
            (
                "etcd",
                find(clients, dlock_rows[1]),
                mutex.cpu_per_cycle(Some("etcd")),
                "etcd per Mutex cycle",
                true,
            ),
        ];
        for (store, dlock, store_cpu, what, store_above) in stores {
            let (Some(dlock), Some(store_cpu)) = (dlock, store_cpu) else {
                continue;
            };
            let floor = hop_part + store_cpu;
            let most = cores / floor;
            lines.push(format!(
                "  dlock/{store}: floor {:.3} ms (+ {what} {:.3}) → at most {most:.0} cycles/s = {:.2}× the Mutex",
                ms(floor),
                ms(store_cpu),
                most / mutex.per_sec()
            ));
            // Above the floor, by process: lock-server against the hop's server and a signature,
            // the generator against the hop's, the store against its part of the floor.
            let above = |role: &str, base: f64| dlock.cpu_per_cycle(Some(role)).map(|c| ms(c - base));
            let parts = [
                (
                    "lock-server",
                    above(
                        "lock-server",
                        hop.cpu_per_cycle(Some("lock-server")).unwrap_or(0.0) + sign_secs,
                    ),
                ),
                (
                    "generator",
                    above("generator", hop.cpu_per_cycle(Some("generator")).unwrap_or(0.0)),
                ),
                (store, above(store, store_cpu).filter(|_| store_above)),
            ];
            let parts: Vec<String> = parts
                .iter()
                .filter_map(|(role, d)| d.map(|d| format!("{role} {d:+.3}")))
                .collect();
            if let Some(all) = dlock.cpu_per_cycle(None) {
                lines.push(format!(
                    "    measured {:.3} ms per cycle ({:.0} cycles/s), above the floor: {}",
                    ms(all),
                    dlock.per_sec(),
                    parts.join(", ")
                ));
            }
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::meter::{Cost, histogram};

    fn phase(name: &str, cycles: u64, cpu: &[(&'static str, f64)]) -> (u32, Phase) {
        let phase = Phase {
            name: name.to_owned(),
            cycles,
            grants: cycles,
            secs: 1.0,
            acquire: histogram().unwrap(),
            cost: Cost {
                cpu: cpu.to_vec(),
                ..Cost::default()
            },
        };
        (16, phase)
    }

    /// 1,000 cycles each: CPU-seconds read as ms per cycle. The floor on PostgreSQL is the hop
    /// (0.03 + 0.05) + a signature (0.02) + lockdb's 0.2 = 0.3 ms, so 2 cores do at most 6,667
    /// cycles/s, 1.33× the Mutex's 5,000; what the dlock row spent above it is lock-server's 0.15
    /// against 0.03 + 0.02 and the generator's 0.08 against 0.05 (lockdb's part is the row's own, so
    /// nothing of it is above). On etcd the store's part is the Mutex's etcd, 0.2 ms per cycle, and
    /// the dlock row's etcd is above it by 0.15.
    #[test]
    fn floors_add_the_hop_a_signature_and_the_store_and_say_what_a_row_spent_above() {
        let rows = [
            phase(HOP_ROW, 1_000, &[("generator", 0.05), ("lock-server", 0.03)]),
            phase(
                "dlock/postgres, distinct",
                1_000,
                &[("generator", 0.08), ("lock-server", 0.15), ("postgres", 0.2)],
            ),
            phase(
                "etcd Mutex, distinct",
                5_000,
                &[("generator", 0.5), ("etcd", 1.0)],
            ),
            phase(
                "dlock/etcd, distinct",
                1_000,
                &[("generator", 0.08), ("lock-server", 0.2), ("etcd", 0.35)],
            ),
        ];
        let lines = floors(
            &rows,
            ["dlock/postgres, distinct", "dlock/etcd, distinct"],
            0.000_02,
            2.0,
        );
        assert_eq!(
            lines,
            [
                "16 clients: the Mutex 5000 cycles/s at 0.300 ms CPU per cycle; the HTTP hop and a signature 0.100 ms",
                "  dlock/postgres: floor 0.300 ms (+ lockdb per dlock cycle 0.200) → at most 6667 cycles/s = 1.33× the Mutex",
                "    measured 0.430 ms per cycle (1000 cycles/s), above the floor: lock-server +0.100, generator +0.030",
                "  dlock/etcd: floor 0.300 ms (+ etcd per Mutex cycle 0.200) → at most 6667 cycles/s = 1.33× the Mutex",
                "    measured 0.630 ms per cycle (1000 cycles/s), above the floor: lock-server +0.150, generator +0.030, etcd +0.150",
            ]
        );
        // Without the hop's row there is no floor to state.
        assert!(
            floors(
                &rows[1..],
                ["dlock/postgres, distinct", "dlock/etcd, distinct"],
                0.0,
                2.0
            )
            .is_empty()
        );
    }
}
