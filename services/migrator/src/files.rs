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
    /// CRC32 of the text with line endings normalised, stored as a signed 32-bit integer like Flyway.
    pub checksum: i32,
}

impl Migration {
    pub fn new(script: &str, sql: String) -> Result<Self, MigrateError> {
        let (kind, description) = parse_name(script)?;
        let checksum = checksum(&sql);
        Ok(Self {
            kind,
            description,
            script: script.to_owned(),
            sql,
            checksum,
        })
    }

    pub fn version_text(&self) -> String {
        match self.kind {
            Kind::Versioned(v) => v.to_string(),
            Kind::Repeatable => String::new(),
        }
    }
}

fn checksum(sql: &str) -> i32 {
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

/// Reads every `*.sql` file of one history, versioned ones in version order, then repeatables by name.
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
        (Kind::Repeatable, Kind::Repeatable) => a.script.cmp(&b.script),
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

    #[test]
    fn checksum_ignores_line_endings_only() {
        assert_eq!(checksum("a\nb\n"), checksum("a\r\nb\r\n"));
        assert_ne!(checksum("a\nb\n"), checksum("a\nc\n"));
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
}
