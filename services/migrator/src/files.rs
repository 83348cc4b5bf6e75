//! Migration files on disk: names, ordering, checksums.

use std::path::Path;

use crate::MigrateError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Versioned(i64),
    Repeatable,
}

#[derive(Debug, Clone)]
pub struct Migration {
    pub kind: Kind,
    /// The description with underscores turned into spaces, as Flyway records it.
    pub description: String,
    /// The file name.
    pub script: String,
    pub sql: String,
    /// Flyway's checksum of the file ([`checksum`]), recorded in the history.
    pub checksum: i32,
    /// What dlock-migrate recorded for this file before it computed checksums as Flyway does
    /// ([`legacy_checksum`]): a history row holding it is corrected once, not refused.
    pub legacy_checksum: i32,
}

impl Migration {
    pub fn new(script: &str, sql: String) -> Result<Self, MigrateError> {
        let (kind, description) = parse_name(script)?;
        Ok(Self {
            kind,
            description,
            script: script.to_owned(),
            checksum: checksum(&sql),
            legacy_checksum: legacy_checksum(&sql),
            sql,
        })
    }

    pub fn version_text(&self) -> String {
        match self.kind {
            Kind::Versioned(v) => v.to_string(),
            Kind::Repeatable => String::new(),
        }
    }
}

/// Flyway's checksum of a script, so that Flyway and dlock-migrate accept each other's histories.
///
/// Flyway 13 (`ChecksumCalculator.calculateChecksumForResource`) reads the file as UTF-8 through a
/// `BufferedReader`, line by line: `readLine` ends a line at `\n`, `\r\n` or a lone `\r` and
/// returns it without the ending. `BomFilter.FilterBomFromString` drops a U+FEFF at the start of the
/// first line only (a BOM further down is content). The CRC32 runs over each line's UTF-8 bytes,
/// with nothing between lines, and `(int) crc.getValue()` keeps the low 32 bits as a signed integer.
/// Splitting at every `\r` and `\n` yields the same lines plus, for `\r\n`, an empty piece that
/// adds no bytes.
pub fn checksum(sql: &str) -> i32 {
    let text = sql.strip_prefix('\u{feff}').unwrap_or(sql);
    let mut h = crc32fast::Hasher::new();
    for line in text.split(['\r', '\n']) {
        h.update(line.as_bytes());
    }
    h.finalize() as i32
}

/// The checksum dlock-migrate recorded before it matched Flyway: CRC32 over each line (split at
/// `\n`, a trailing `\r` dropped) followed by `\n`, a BOM kept. Only used to recognise such rows.
pub fn legacy_checksum(sql: &str) -> i32 {
    let mut h = crc32fast::Hasher::new();
    for line in sql.lines() {
        h.update(line.trim_end_matches('\r').as_bytes());
        h.update(b"\n");
    }
    h.finalize() as i32
}

fn snake_case(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !s.starts_with('_')
        && !s.ends_with('_')
}

/// `V12__add_index.sql` → (Versioned(12), "add index"); `R__seed.sql` → (Repeatable, "seed").
pub fn parse_name(file: &str) -> Result<(Kind, String), MigrateError> {
    let bad = || MigrateError::BadName {
        file: file.to_owned(),
    };
    let stem = file.strip_suffix(".sql").ok_or_else(bad)?;
    let (prefix, desc) = stem.split_once("__").ok_or_else(bad)?;
    if !snake_case(desc) {
        return Err(bad());
    }
    let kind = if prefix == "R" {
        Kind::Repeatable
    } else {
        let digits = prefix.strip_prefix('V').ok_or_else(bad)?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.starts_with('0') {
            return Err(bad());
        }
        Kind::Versioned(digits.parse().map_err(|_| bad())?)
    };
    Ok((kind, desc.replace('_', " ")))
}

/// Reads every `*.sql` file of one history, versioned ones in version order, then repeatables by
/// description.
pub fn load_dir(dir: &Path) -> Result<Vec<Migration>, MigrateError> {
    sort_and_check(read_dir(dir)?)
}

/// One history assembled from several locations (Flyway's `locations`), e.g. the production paydb
/// history plus the synthetic seed that only the demo, the tests and the benchmarks apply. A version
/// or repeatable present in two locations is refused like a duplicate within one.
pub fn load_dirs<P: AsRef<Path>>(dirs: &[P]) -> Result<Vec<Migration>, MigrateError> {
    let mut all = Vec::new();
    for dir in dirs {
        all.extend(read_dir(dir.as_ref())?);
    }
    sort_and_check(all)
}

fn read_dir(dir: &Path) -> Result<Vec<Migration>, MigrateError> {
    let io = |source| MigrateError::Io {
        path: dir.display().to_string(),
        source,
    };
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".sql") {
            continue;
        }
        let sql = std::fs::read_to_string(entry.path()).map_err(|source| MigrateError::Io {
            path: entry.path().display().to_string(),
            source,
        })?;
        out.push(Migration::new(&name, sql)?);
    }
    Ok(out)
}

pub(crate) fn sort_and_check(mut out: Vec<Migration>) -> Result<Vec<Migration>, MigrateError> {
    out.sort_by(|a, b| match (a.kind, b.kind) {
        (Kind::Versioned(x), Kind::Versioned(y)) => x.cmp(&y),
        (Kind::Versioned(_), Kind::Repeatable) => std::cmp::Ordering::Less,
        (Kind::Repeatable, Kind::Versioned(_)) => std::cmp::Ordering::Greater,
        // Flyway's order (ResolvedMigrationComparator): repeatables by description, not file name.
        (Kind::Repeatable, Kind::Repeatable) => a.description.cmp(&b.description),
    });
    for pair in out.windows(2) {
        match (pair[0].kind, pair[1].kind) {
            (Kind::Versioned(x), Kind::Versioned(y)) if x == y => {
                return Err(MigrateError::DuplicateVersion {
                    version: x,
                    first: pair[0].script.clone(),
                    second: pair[1].script.clone(),
                });
            }
            (Kind::Repeatable, Kind::Repeatable) if pair[0].description == pair[1].description => {
                return Err(MigrateError::DuplicateRepeatable {
                    description: pair[0].description.clone(),
                });
            }
            _ => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(
            parse_name("V1__create_lock_session.sql").ok(),
            Some((Kind::Versioned(1), "create lock session".into()))
        );
        assert_eq!(
            parse_name("R__seed_synthetic_accounts.sql").ok(),
            Some((Kind::Repeatable, "seed synthetic accounts".into()))
        );
        for bad in [
            "V1_x.sql",
            "V__x.sql",
            "v1__x.sql",
            "V1__X.sql",
            "V01__x.sql",
            "V1__x.txt",
            "R_x.sql",
            "V1__.sql",
            "V1__a-b.sql",
        ] {
            assert!(parse_name(bad).is_err(), "{bad}");
        }
    }

    /// Values Flyway 13.12.2 itself computed for these texts (its ChecksumCalculator on a
    /// FileSystemResource holding each, read as UTF-8); tests/flyway.rs compares with the live
    /// Flyway's `info` as well.
    #[test]
    fn checksum_is_flyways() {
        for (text, flyway) in FLYWAY_CHECKSUMS {
            assert_eq!(checksum(text), *flyway, "{text:?}");
        }
    }

    #[test]
    fn checksum_ignores_line_endings_and_boms_only() {
        let base = checksum("a\nb\n");
        for same in [
            "a\r\nb\r\n",
            "a\rb\r",
            "a\nb",
            "\u{feff}a\nb\n",
            "a\n\n\nb",
            "a\r\r\n\n\rb\n\n",
        ] {
            assert_eq!(checksum(same), base, "{same:?}");
        }
        // Only the first line's BOM is dropped, and only one.
        for different in [
            "a\nc\n",
            "a b\n",
            "\u{feff}\u{feff}a\nb",
            "a\n\u{feff}b",
            "\n\u{feff}ab",
        ] {
            assert_ne!(checksum(different), base, "{different:?}");
        }
    }

    /// What dlock-migrate recorded before (values of the former `checksum`), so that rows holding
    /// them are recognised.
    #[test]
    fn legacy_checksum_is_the_former_one() {
        assert_eq!(legacy_checksum("a\nb\n"), LEGACY_A_NL_B_NL);
        assert_eq!(legacy_checksum("a\r\nb\r\n"), LEGACY_A_NL_B_NL);
        assert_ne!(legacy_checksum("a\nb\n"), checksum("a\nb\n"));
    }

    #[test]
    fn duplicate_versions_refused() {
        let ms = vec![
            Migration::new("V1__a.sql", "select 1".into()),
            Migration::new("V1__b.sql", "select 1".into()),
        ];
        let ms: Result<Vec<_>, _> = ms.into_iter().collect();
        assert!(matches!(
            sort_and_check(ms.expect("names")),
            Err(MigrateError::DuplicateVersion { .. })
        ));
    }

    /// (text, the checksum Flyway 13.12.2 computes for a file holding it).
    const FLYWAY_CHECKSUMS: &[(&str, i32)] = &[
        ("", 0),
        ("a\nb\n", -1635563411),
        ("a\r\nb\r\n", -1635563411),
        ("a\rb", -1635563411),
        ("\u{feff}a\nb\n", -1635563411),
        ("a\n\u{feff}b", -444179588),
        ("\u{feff}\u{feff}a\nb", -1215460041),
        ("CREATE TABLE t (a INT);", -1453062805),
        ("-- é ü 日本\nSELECT 'x';\r\n\r\n", -690818821),
        ("a\r\r\n\n\rb\n\n", -1635563411),
    ];

    /// CRC32("a\nb\n") as a signed integer: the former checksum of "a\nb\n".
    const LEGACY_A_NL_B_NL: i32 = 408365719;
}
