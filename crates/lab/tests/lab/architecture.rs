//! The crate picture of docs/DESIGN-NOTES.md, checked on the manifests: a dependency that
//! points the wrong way fails here, not in review.

use std::path::Path;

/// The fedfuse crates `krate` depends on (normal dependencies).
fn fedfuse_deps(krate: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../{krate}/Cargo.toml"));
    let manifest: toml::Table = toml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    manifest
        .get("dependencies")
        .and_then(|d| d.as_table())
        .map(|d| {
            d.keys()
                .filter(|k| k.starts_with("fedfuse"))
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn dependencies_point_one_way() {
    let forbidden: &[(&str, &[&str])] = &[
        (
            "core",
            &[
                "fedfuse-data",
                "fedfuse-train",
                "fedfuse-fuse",
                "fedfuse-fed",
                "fedfuse-lab",
                "fedfuse",
            ],
        ),
        (
            "data",
            &[
                "fedfuse-train",
                "fedfuse-fuse",
                "fedfuse-fed",
                "fedfuse-lab",
                "fedfuse",
            ],
        ),
        (
            "fuse",
            &[
                "fedfuse-data",
                "fedfuse-train",
                "fedfuse-fed",
                "fedfuse-lab",
                "fedfuse",
            ],
        ),
        (
            "train",
            &["fedfuse-fuse", "fedfuse-fed", "fedfuse-lab", "fedfuse"],
        ),
        ("fed", &["fedfuse-lab", "fedfuse"]),
        // The protocol crates are transport: they know records, not methods or training.
        (
            "flower-proto",
            &[
                "fedfuse-core",
                "fedfuse-data",
                "fedfuse-train",
                "fedfuse-fuse",
                "fedfuse-fed",
                "fedfuse-lab",
                "fedfuse",
            ],
        ),
        (
            "flower-node",
            &[
                "fedfuse-data",
                "fedfuse-train",
                "fedfuse-fuse",
                "fedfuse-fed",
                "fedfuse-lab",
                "fedfuse",
            ],
        ),
        ("lab", &["fedfuse"]),
    ];
    for (krate, bad) in forbidden {
        let deps = fedfuse_deps(krate);
        assert!(
            !deps.is_empty() || matches!(*krate, "core" | "flower-proto"),
            "{krate} has no fedfuse dependency?"
        );
        for d in &deps {
            assert!(
                !bad.contains(&d.as_str()),
                "crates/{krate} must not depend on {d}"
            );
        }
    }
}
