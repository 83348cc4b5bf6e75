//! Checks every service's OpenAPI document gets: the copy in docs/openapi/ is what the types and
//! handlers generate (rewritten with `DLOCK_UPDATE_OPENAPI=1`, as crds/ is by crdgen), it is OpenAPI
//! 3.1 with no dangling `$ref`, it lists exactly the routes the router serves, and it marks exactly
//! the protected routes with the bearer requirement.

use std::collections::BTreeSet;
use std::path::Path;

use serde_yaml::Value;

const HTTP_METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// (METHOD, path template), e.g. `("POST", "/v1/locks/{key}/acquire")`.
pub type Operation = (String, String);

/// Fails when `file` differs from `generated`; with `DLOCK_UPDATE_OPENAPI=1` rewrites it instead.
pub fn assert_fresh(generated: &str, file: &Path) {
    let on_disk = std::fs::read_to_string(file).unwrap_or_default();
    if on_disk == generated {
        return;
    }
    if std::env::var_os("DLOCK_UPDATE_OPENAPI").is_some_and(|v| v == "1") {
        std::fs::write(file, generated).unwrap_or_else(|e| panic!("cannot write {}: {e}", file.display()));
        return;
    }
    let first = on_disk
        .lines()
        .zip(generated.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| on_disk.lines().count().min(generated.lines().count()));
    panic!(
        "{} is stale (first difference at line {}: {:?} on disk, {:?} generated); regenerate it with \
         DLOCK_UPDATE_OPENAPI=1 cargo test --test openapi",
        file.display(),
        first + 1,
        on_disk.lines().nth(first).unwrap_or("<end>"),
        generated.lines().nth(first).unwrap_or("<end>"),
    );
}

fn parse(yaml: &str) -> Value {
    serde_yaml::from_str(yaml).expect("the OpenAPI document is valid YAML")
}

/// Every operation the document lists.
pub fn documented(yaml: &str) -> BTreeSet<Operation> {
    let doc = parse(yaml);
    let mut ops = BTreeSet::new();
    if let Some(paths) = doc["paths"].as_mapping() {
        for (path, item) in paths {
            let path = path.as_str().expect("a path is a string");
            for (method, _) in item.as_mapping().expect("a path item is a mapping") {
                let method = method.as_str().expect("a method is a string");
                if HTTP_METHODS.contains(&method) {
                    ops.insert((method.to_uppercase(), path.to_owned()));
                }
            }
        }
    }
    ops
}

/// Every operation whose `security` requires the bearer scheme.
pub fn protected(yaml: &str) -> BTreeSet<Operation> {
    let doc = parse(yaml);
    documented(yaml)
        .into_iter()
        .filter(|(method, path)| {
            let op = &doc["paths"][path.as_str()][method.to_lowercase().as_str()];
            op["security"]
                .as_sequence()
                .is_some_and(|reqs| reqs.iter().any(|r| r.get("bearer").is_some()))
        })
        .collect()
}

/// OpenAPI 3.1, every `$ref` resolves, and every operation answers at least one documented status.
pub fn assert_well_formed(yaml: &str) {
    let doc = parse(yaml);
    assert_eq!(doc["openapi"].as_str(), Some("3.1.0"));
    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Mapping(m) => {
                for (k, v) in m {
                    if k.as_str() == Some("$ref") {
                        out.push(v.as_str().expect("a $ref is a string").to_owned());
                    } else {
                        refs(v, out);
                    }
                }
            }
            Value::Sequence(s) => s.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    refs(&doc, &mut all);
    assert!(!all.is_empty(), "the document references no schema");
    for r in all {
        let mut node = &doc;
        for part in r.trim_start_matches("#/").split('/') {
            node = &node[part];
        }
        assert!(!node.is_null(), "dangling $ref {r}");
    }
    for (method, path) in documented(yaml) {
        let op = &doc["paths"][path.as_str()][method.to_lowercase().as_str()];
        assert!(
            op["responses"].as_mapping().is_some_and(|r| !r.is_empty()),
            "{method} {path} documents no response"
        );
    }
}

/// The document lists exactly `served`.
pub fn assert_matches_routes(yaml: &str, served: &BTreeSet<Operation>) {
    let documented = documented(yaml);
    let undocumented: Vec<_> = served.difference(&documented).collect();
    let unserved: Vec<_> = documented.difference(served).collect();
    assert!(
        undocumented.is_empty(),
        "served but not in the OpenAPI document: {undocumented:?}"
    );
    assert!(
        unserved.is_empty(),
        "in the OpenAPI document but not served: {unserved:?}"
    );
}

/// The document requires the bearer scheme on exactly `expected`.
pub fn assert_protected(yaml: &str, expected: &BTreeSet<Operation>) {
    let marked = protected(yaml);
    assert_eq!(
        &marked, expected,
        "bearer-protected operations: documented vs enforced"
    );
    if !expected.is_empty() {
        let doc = parse(yaml);
        assert_eq!(
            doc["components"]["securitySchemes"]["bearer"]["scheme"].as_str(),
            Some("bearer")
        );
    }
}

/// `(method, path)` pairs as [`Operation`]s.
pub fn operations<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> BTreeSet<Operation> {
    pairs
        .into_iter()
        .map(|(m, p)| (m.to_owned(), p.to_owned()))
        .collect()
}
