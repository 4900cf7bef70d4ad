//! docs/CONFIG.md against the config loader: every key the loader accepts has a row, and every
//! row names a key the loader accepts (or one it refuses, said so in the row).
//!
//! The loader's keys come from its own errors. Serde's "unknown field" error lists every field
//! the section expects, and the custom readers (PFNM's table, FedNGM's NGM tables) call
//! `unknown_field` with their full lists too, so a bogus key in each section, picked by its
//! `kind`, `name` or `type`, gives that section's keys; an "unknown variant" error gives the
//! kinds. CONFIG.md names the section(s) of each table in a `<!-- keys: ... -->` comment.

use std::collections::{BTreeMap, BTreeSet};

use fedfuse_lab::Config;

const BOGUS: &str = "zz_not_a_key";

/// A valid classifier run: the base every section is probed from.
const BASE: &str = r#"
rounds = 3
clients = 2
[dataset]
name = "digits"
[method]
name = "fedavg"
[model]
kind = "mlp"
hidden = [8]
"#;

/// A valid tabular run, for the tabular methods' refused keys.
const TABLE_BASE: &str = r#"
rounds = 3
clients = 2
[table]
kind = "synthetic"
features = 4
rows_per_client = 50
edge_prob = 0.5
[method]
name = "fedngm"
"#;

fn parse(base: &str, set: &[String]) -> Result<Config, String> {
    Config::parse(base, set).map_err(|e| format!("{e:#}"))
}

/// The backquoted names after `what` on the first line of `err` that holds it: serde's lists
/// read "expected one of `a`, `b`", "expected `a` or `b`", "expected `a`" or "there are no
/// fields".
fn listed(err: &str, what: &str) -> Option<BTreeSet<String>> {
    let line = err.lines().find(|l| l.contains(what))?;
    let rest = &line[line.find(what)? + what.len()..];
    Some(
        rest.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect(),
    )
}

/// The keys a section accepts: the list of the error a bogus key under `path` causes, with
/// `set` picking the section's kind.
fn section_keys(set: &[String], path: &str) -> Option<BTreeSet<String>> {
    let mut set = set.to_vec();
    set.push(match path {
        "" => format!("{BOGUS}=1"),
        _ => format!("{path}.{BOGUS}=1"),
    });
    let err = parse(BASE, &set).err()?;
    listed(&err, &format!("unknown field `{BOGUS}`"))
}

/// The names a tagged section takes: the list of the error an unknown one causes.
fn variants(set: &[String]) -> BTreeSet<String> {
    let err = parse(BASE, set).expect_err("a bogus variant name was accepted");
    listed(&err, "unknown variant `bogus`").unwrap_or_else(|| panic!("no variant list: {err}"))
}

/// The sections whose keys depend on a name, and the key that holds it.
const TAGGED: [(&str, &str); 4] = [
    ("partition.kind", "partition"),
    ("method.name", "method"),
    ("privacy.kind", "privacy"),
    ("table.kind", "table"),
];

/// A section the test probes: its id in CONFIG.md, the `--set` values that pick it, and its
/// path in the file (empty for the top level).
struct Section {
    id: String,
    set: Vec<String>,
    path: String,
}

/// Every section of a run config and the keys it accepts, found from the loader's errors:
/// the fixed sections, the tagged ones per variant, and every key of theirs that is itself a
/// table of keys (FedNGM's `graph`, `local`, `sample`...), recursively.
fn loader_sections() -> BTreeMap<String, BTreeSet<String>> {
    let mut todo = vec![Section {
        id: "top".into(),
        set: vec![],
        path: String::new(),
    }];
    for (tag, path) in TAGGED {
        for v in variants(&[format!("{tag}=\"bogus\"")]) {
            todo.push(Section {
                id: format!("{path}.{v}"),
                set: vec![format!("{tag}=\"{v}\"")],
                path: path.into(),
            });
        }
    }
    let mut found = BTreeMap::new();
    while let Some(s) = todo.pop() {
        let keys = section_keys(&s.set, &s.path).unwrap_or_else(|| {
            panic!(
                "section {}: a bogus key gave no list of expected keys",
                s.id
            )
        });
        for k in &keys {
            if s.id == "top" && TAGGED.iter().any(|(_, p)| p == k) {
                continue; // probed per kind above
            }
            let path = match s.path.as_str() {
                "" => k.clone(),
                p => format!("{p}.{k}"),
            };
            if section_keys(&s.set, &path).is_some() {
                let id = match s.id.as_str() {
                    "top" => k.clone(),
                    id => format!("{id}.{k}"),
                };
                todo.push(Section {
                    id,
                    set: s.set.clone(),
                    path,
                });
            }
        }
        found.insert(s.id, keys);
    }
    // Layer types: an array of tables, probed one layer at a time.
    let layers = |layer: &str| {
        vec![
            "model.kind=\"sequential\"".to_string(),
            "model.hidden=[]".to_string(),
            format!("model.layers=[{{ {layer} }}]"),
        ]
    };
    for t in variants(&layers("type = \"bogus\"")) {
        // A layer type without keys (`relu`, `flatten`) lets a stray key through serde
        // (internally tagged unit variants do), so it is taken as having none.
        let keys = match parse(BASE, &layers(&format!("type = \"{t}\", {BOGUS} = 1"))) {
            Err(e) => listed(&e, &format!("unknown field `{BOGUS}`")).unwrap_or_default(),
            Ok(_) => BTreeSet::new(),
        };
        found.insert(format!("model.layers.{t}"), keys);
    }
    found
}

/// One section's rows in CONFIG.md: the keys it takes, and the keys the loader refuses there
/// (rows whose meaning starts with "Refused").
#[derive(Default, Debug)]
struct Documented {
    keys: BTreeSet<String>,
    refused: BTreeSet<String>,
}

/// The cells of a table row, split at unescaped `|`.
fn cells(row: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut escaped = false;
    for c in row
        .trim()
        .trim_start_matches('|')
        .trim_end_matches('|')
        .chars()
    {
        match c {
            '|' if !escaped => out.push(String::new()),
            _ => out.last_mut().unwrap().push(c),
        }
        escaped = c == '\\';
    }
    out.into_iter().map(|c| c.trim().to_string()).collect()
}

/// The backquoted keys of a first cell, leaving out defaults in brackets and remarks in
/// parentheses: "`alpha` [0.1], `column` (alias `partition_by`)" is `alpha` and `column`.
fn cell_keys(cell: &str) -> Vec<String> {
    let mut bare = String::new();
    let mut depth = 0usize;
    for c in cell.chars() {
        match c {
            '[' | '(' => depth += 1,
            ']' | ')' => depth = depth.saturating_sub(1),
            _ if depth == 0 => bare.push(c),
            _ => {}
        }
    }
    bare.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// CONFIG.md's tables by section id.
fn documented(text: &str) -> BTreeMap<String, Documented> {
    let mut docs: BTreeMap<String, Documented> = BTreeMap::new();
    let mut ids: Vec<String> = Vec::new();
    let mut rows = 0;
    for (n, line) in text.lines().enumerate() {
        if let Some(list) = line
            .strip_prefix("<!-- keys:")
            .and_then(|l| l.strip_suffix("-->"))
        {
            assert!(
                ids.is_empty(),
                "line {}: a keys comment without its table",
                n + 1
            );
            ids = list.split_whitespace().map(str::to_string).collect();
            assert!(
                !ids.is_empty(),
                "line {}: a keys comment names no section",
                n + 1
            );
            rows = 0;
            continue;
        }
        if ids.is_empty() {
            continue;
        }
        if !line.starts_with('|') {
            assert!(
                rows > 2,
                "line {}: a keys comment not followed by a table",
                n + 1
            );
            ids.clear();
            continue;
        }
        rows += 1;
        if rows <= 2 {
            continue; // the header and the separator
        }
        let cells = cells(line);
        assert_eq!(cells.len(), 2, "line {}: a key row has two cells", n + 1);
        let keys = cell_keys(&cells[0]);
        assert!(!keys.is_empty(), "line {}: a row names no key", n + 1);
        let refused = cells[1].starts_with("Refused");
        for id in &ids {
            let doc = docs.entry(id.clone()).or_default();
            for k in &keys {
                let new = match refused {
                    true => doc.refused.insert(k.clone()),
                    false => doc.keys.insert(k.clone()),
                };
                assert!(new, "line {}: `{k}` of {id} has a row already", n + 1);
            }
        }
    }
    docs
}

/// The base a section's refused keys are tried on (it must load as it is).
fn valid_base(id: &str) -> (&'static str, Vec<String>) {
    let parts: Vec<&str> = id.split('.').collect();
    match parts.as_slice() {
        ["method", name @ ("fedngm" | "fedngr"), ..] => {
            (TABLE_BASE, vec![format!("method.name=\"{name}\"")])
        }
        ["method", name, ..] => (BASE, vec![format!("method.name=\"{name}\"")]),
        _ => panic!("CONFIG.md marks a key of {id} refused; give the test a valid base for {id}"),
    }
}

/// Every value a refused key is tried with; the loader must refuse each.
const PROBES: &[&str] = &["1", "0.5", "\"x\"", "[0.5]", "[1]", "true", "{}"];

fn config_md() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/CONFIG.md");
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn docs_config_md_lists_every_key_the_loader_accepts_and_no_other() {
    let loader = loader_sections();
    let text = config_md();
    let docs = documented(&text);
    // Sanity: the probe found the sections it must find.
    for id in [
        "top",
        "dataset",
        "train",
        "method.pfnm",
        "method.fedngm.sample.infer",
    ] {
        assert!(
            loader.contains_key(id),
            "the loader probe missed {id}: {loader:?}"
        );
    }
    let mut problems = Vec::new();
    for (id, keys) in &loader {
        let Some(doc) = docs.get(id) else {
            if !keys.is_empty() {
                problems.push(format!(
                    "{id}: keys {keys:?} and no table (<!-- keys: {id} -->)"
                ));
            }
            // A section without keys is still named: its kind, method or layer type.
            let name = id.rsplit('.').next().unwrap();
            if !text.contains(&format!("`{name}`")) {
                problems.push(format!("{id}: `{name}` is not named in CONFIG.md"));
            }
            continue;
        };
        // A refused key may be one the loader lists (it reads it, then refuses it) or not;
        // the refused keys' own test tries each.
        let rows: BTreeSet<String> = doc.keys.union(&doc.refused).cloned().collect();
        let missing: Vec<_> = keys.difference(&rows).collect();
        let stale: Vec<_> = doc.keys.difference(keys).collect();
        if !missing.is_empty() {
            problems.push(format!("{id}: accepted but undocumented: {missing:?}"));
        }
        if !stale.is_empty() {
            problems.push(format!(
                "{id}: documented, unknown to the loader: {stale:?}"
            ));
        }
    }
    for id in docs.keys() {
        if !loader.contains_key(id) {
            problems.push(format!(
                "{id}: CONFIG.md has a table, the loader no such section"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/CONFIG.md:\n{}",
        problems.join("\n")
    );
}

#[test]
fn docs_config_md_refused_keys_are_refused() {
    let docs = documented(&config_md());
    let mut tried = 0;
    for (id, doc) in &docs {
        for key in &doc.refused {
            let (base, set) = valid_base(id);
            parse(base, &set).unwrap_or_else(|e| panic!("{id}: the base does not load: {e}"));
            let path: Vec<&str> = id.split('.').skip(2).collect();
            let path = match path.is_empty() {
                true => format!("method.{key}"),
                false => format!("method.{}.{key}", path.join(".")),
            };
            for value in PROBES {
                let mut with = set.clone();
                with.push(format!("{path}={value}"));
                assert!(
                    parse(base, &with).is_err(),
                    "CONFIG.md says {id} refuses `{key}`, and `{path} = {value}` loads"
                );
            }
            tried += 1;
        }
    }
    assert!(tried >= 4, "{tried} refused keys");
}

#[test]
fn docs_config_md_parser_reads_rows() {
    assert_eq!(
        cell_keys("`alpha` [0.1], `beta` [[0.4, 0.9]], `column` (alias `partition_by`)"),
        ["alpha", "beta", "column"]
    );
    assert_eq!(cells("| `path` | `raw` or `\\|W\\|` |").len(), 2);
    let listed =
        |e: &str| listed(e, "unknown field `x`").map(|s| s.into_iter().collect::<Vec<_>>());
    assert_eq!(
        listed("unknown field `x`, expected one of `a`, `b`\nin `m`"),
        Some(vec!["a".into(), "b".into()])
    );
    assert_eq!(
        listed("unknown field `x`, expected `a` or `b`"),
        Some(vec!["a".into(), "b".into()])
    );
    assert_eq!(
        listed("unknown field `x`, there are no fields"),
        Some(vec![])
    );
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The README, the guides and the reference pages link to files and headings that exist, so a
/// moved page or a renamed heading cannot leave the entry point pointing nowhere.
#[test]
fn docs_links_between_the_readme_and_the_guides_resolve() {
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let mut pages = vec![root.join("README.md"), root.join("docs/CONFIG.md")];
    pages.push(root.join("docs/LAYOUT.md"));
    let mut guides: Vec<_> = std::fs::read_dir(root.join("docs/guides"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    guides.sort();
    assert!(guides.len() >= 5, "{guides:?}");
    pages.extend(guides);
    let mut checked = 0;
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for link in text.split("](").skip(1) {
            let target = &link[..link.find(')').unwrap_or(0)];
            if target.contains("://") || target.is_empty() {
                continue;
            }
            let (file, heading) = target.split_once('#').unwrap_or((target, ""));
            let path = match file {
                "" => page.clone(),
                f => page.parent().unwrap().join(f),
            };
            checked += 1;
            if !path.exists() {
                broken.push(format!("{}: {target}: no such file", page.display()));
                continue;
            }
            if heading.is_empty() || path.is_dir() {
                continue;
            }
            let anchors: BTreeSet<String> = std::fs::read_to_string(&path)
                .unwrap()
                .lines()
                .filter(|l| l.starts_with('#'))
                .map(|l| anchor(l.trim_start_matches('#')))
                .collect();
            if !anchors.contains(heading) {
                broken.push(format!("{}: {target}: no such heading", page.display()));
            }
        }
    }
    assert!(checked >= 20, "{checked} links");
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}
