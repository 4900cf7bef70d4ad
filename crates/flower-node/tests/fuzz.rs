//! Fuzzing the node's object assembly (`Pulled::inflate`) with what a hostile SuperLink can
//! serve: a valid message's objects, one of them edited (bit flips, truncations, JSON tokens,
//! chunk indices repeated, size fields set huge), and every id above it recomputed, as a
//! SuperLink computes them, so the edit reaches the parser past the id checks. Ok or Err,
//! never a panic, and a heap peak within a bound proportional to the bytes served (counted by
//! this binary's allocator: `crates/core/tests/core/fuzz/harness.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

#[path = "../../core/tests/core/fuzz/harness.rs"]
mod harness;

use std::collections::HashMap;

use fedfuse_core::ConfigValue;
use fedfuse_core::flower::{FlowerArray, MetricValue};
use fedfuse_flower_node::objects::{
    CONFIG, METRICS, Pulled, Record, RecordDict, deflate, object_id,
};
use fedfuse_flower_proto::flwr::proto;
use harness::{Budget, fuzz, mutated, within};
use proptest::prelude::*;

/// What assembly may hold: the objects' own bytes (the store), the arrays copied out of them
/// (at most the shape's bound per array), the parsed JSON and protobuf.
const ASSEMBLY: Budget = Budget {
    per_byte: 64,
    slack: 4 << 20,
};

/// Tokens spliced into heads and JSON bodies.
const TOKENS: &[&str] = &[
    " ",
    ",",
    "\0",
    "\"",
    ":",
    "{",
    "}",
    "[0, 0, 0, 0, 0, 0, 0, 0]",
    "[1099511627776]",
    "\"arraychunk_ids\": [0, 0, 0, 0]",
    "ArrayChunk",
    "Array",
    "99999999999",
];

/// Messages as the node and Flower write them: arrays of several chunks, a repeated array,
/// config and metrics.
fn messages() -> Vec<fedfuse_flower_node::objects::Deflated> {
    let array = |key: &str, n: usize, stype: &str| FlowerArray {
        key: key.into(),
        dtype: "float32".into(),
        shape: vec![n],
        stype: stype.into(),
        data: (0..4 * n).map(|i| i as u8).collect(),
    };
    let content = RecordDict(vec![
        (
            "arrays".into(),
            Record::Arrays(vec![
                array("layers.0.weight", 6, "numpy.ndarray"),
                array("layers.0.bias", 3, "numpy.ndarray"),
                array("big", 40_000, "fedfuse.sparse.v1"),
            ]),
        ),
        (
            CONFIG.into(),
            Record::Config(vec![("server-round".into(), ConfigValue::Int(1))]),
        ),
        (
            METRICS.into(),
            Record::Metrics(vec![("num-examples".into(), MetricValue::Int(10))]),
        ),
    ]);
    let meta = proto::Metadata {
        run_id: 1,
        message_type: "train".into(),
        ttl: 100.0,
        ..Default::default()
    };
    vec![deflate(meta, Some(&content), None)]
}

/// The objects of `tree` in post-order (children before their parent).
fn post_order(tree: &proto::ObjectTree, out: &mut Vec<String>) {
    for child in &tree.children {
        post_order(child, out);
    }
    if !out.contains(&tree.object_id) {
        out.push(tree.object_id.clone());
    }
}

/// The store after replacing the object at `which` (post-order) by `edited`: every object
/// above it is rewritten with its children's new ids and hashed again. Returns the objects
/// and the message's new id.
fn rehashed(
    objects: &HashMap<String, Vec<u8>>,
    order: &[String],
    which: usize,
    edited: Vec<u8>,
) -> (Vec<(String, Vec<u8>)>, String) {
    let mut renamed: Vec<(String, String)> = Vec::new();
    let mut out = Vec::new();
    for (i, id) in order.iter().enumerate() {
        let mut content = if i == which {
            edited.clone()
        } else {
            objects[id].clone()
        };
        if i != which {
            for (old, new) in &renamed {
                content = replace(&content, old.as_bytes(), new.as_bytes());
            }
        }
        let new_id = object_id(&content);
        if &new_id != id {
            renamed.push((id.clone(), new_id.clone()));
        }
        out.push((new_id, content));
    }
    let root = out.last().unwrap().0.clone();
    (out, root)
}

fn replace(haystack: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len());
    let mut i = 0;
    while i < haystack.len() {
        if haystack[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(haystack[i]);
            i += 1;
        }
    }
    out
}

#[test]
fn node_objects_mutated() {
    let message = messages().remove(0);
    let mut order = Vec::new();
    post_order(&message.tree, &mut order);
    let seeds: Vec<Vec<u8>> = order.iter().map(|id| message.objects[id].clone()).collect();
    let objects = message.objects.clone();
    // Which object is edited, and how.
    let cases = (0..order.len())
        .prop_flat_map(move |i| (Just(i), mutated(vec![seeds[i].clone()], &[0], TOKENS)));
    fuzz(
        "node_objects_mutated",
        1500,
        cases,
        move |(which, edited)| {
            let (store, root) = rehashed(&objects, &order, which, edited);
            let served: usize = store.iter().map(|(_, c)| c.len()).sum();
            let mut pulled = Pulled::new();
            for (id, content) in store {
                // Ids are recomputed, so every insert passes its hash check.
                pulled.insert(&id, content).unwrap();
            }
            within(ASSEMBLY, served, || pulled.inflate(&root)).map(drop)
        },
    );
}
