//! The fuzzing harness of the fuzz modules of fedfuse-core, fedfuse-data and fedfuse-lab (one
//! file, included by each test binary): a counting allocator, case counts from
//! `PROPTEST_CASES`, arbitrary and mutated inputs.
// Each test binary uses part of it.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::test_runner::{Config, FileFailurePersistence, TestRunner};

/// The system allocator, counting each thread's live heap bytes and their peak.
struct Counting;

#[global_allocator]
static COUNTING: Counting = Counting;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
    static TALLY: Cell<Tally> = const { Cell::new(Tally { accepted: 0, peak: 0, len: 0 }) };
}

/// What the running test's parsers did: inputs accepted, the largest heap peak and the
/// size of the input it came with.
#[derive(Clone, Copy)]
struct Tally {
    accepted: usize,
    peak: usize,
    len: usize,
}

fn grew(n: usize) {
    // try_with: the allocator also runs while thread-locals are torn down.
    let _ = LIVE.try_with(|live| {
        let now = live.get().saturating_add(n);
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

fn shrank(n: usize) {
    let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(n)));
}

// SAFETY: every call is forwarded to `System` unchanged; the bookkeeping only touches
// const-initialised thread-locals, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as for `alloc`.
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                shrank(layout.size() - new_size);
            }
        }
        p
    }
}

/// `f`'s result and the most heap bytes its thread held during it, above what it held
/// before.
pub fn peak_heap<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let out = f();
    (out, PEAK.with(Cell::get).saturating_sub(base))
}

/// Heap a parser may hold: `per_byte` times its input, plus `slack`.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub per_byte: usize,
    pub slack: usize,
}

/// Runs `parse` on an input of `len` bytes; a heap peak over `budget` fails the case.
pub fn within<T, E>(
    budget: Budget,
    len: usize,
    parse: impl FnOnce() -> Result<T, E>,
) -> Result<Result<T, E>, TestCaseError> {
    let (out, peak) = peak_heap(parse);
    TALLY.with(|t| {
        let mut tally = t.get();
        tally.accepted += usize::from(out.is_ok());
        if peak > tally.peak {
            (tally.peak, tally.len) = (peak, len);
        }
        t.set(tally);
    });
    let limit = budget
        .per_byte
        .saturating_mul(len)
        .saturating_add(budget.slack);
    if peak > limit {
        return Err(TestCaseError::fail(format!(
            "{peak} heap bytes for a {len}-byte input, over the {limit} allowed"
        )));
    }
    Ok(out)
}

/// `parse` refuses `input`, which declares a huge size, within a second and 1 MiB of heap.
pub fn refused<T, E: std::fmt::Display>(
    what: &str,
    input: &[u8],
    parse: impl FnOnce() -> Result<T, E>,
) {
    let start = Instant::now();
    let (out, peak) = peak_heap(parse);
    let took = start.elapsed();
    let head = String::from_utf8_lossy(&input[..input.len().min(120)]).into_owned();
    match out {
        Ok(_) => panic!("{what}: accepted {head:?}"),
        Err(e) => {
            assert!(
                peak <= 1 << 20,
                "{what}: {peak} heap bytes to refuse {head:?}: {e}"
            );
            assert!(
                took < Duration::from_secs(1),
                "{what}: {took:?} to refuse {head:?}"
            );
        }
    }
}

/// `PROPTEST_CASES` when set, else `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `check` on [`cases`] values of `strategy`; a panic or a failed check fails the test
/// with the shrunk input. Prints the cases run and the largest heap peak.
#[track_caller]
pub fn fuzz<S: Strategy>(
    name: &str,
    default_cases: u32,
    strategy: S,
    check: impl Fn(S::Value) -> Result<(), TestCaseError>,
) {
    let config = Config {
        cases: cases(default_cases),
        // Failures persist beside the calling test file (`fuzz.proptest-regressions`).
        source_file: Some(std::panic::Location::caller().file()),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        max_shrink_time: 60_000,
        ..Config::default()
    };
    TALLY.with(|t| {
        t.set(Tally {
            accepted: 0,
            peak: 0,
            len: 0,
        })
    });
    let ran = Cell::new(0u64);
    let start = Instant::now();
    let mut runner = TestRunner::new(config);
    let result = runner.run(&strategy, |v| {
        ran.set(ran.get() + 1);
        check(v)
    });
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
    let tally = TALLY.with(Cell::get);
    eprintln!(
        "fuzz {name}: {} cases, 0 panics, {} parses accepted, heap peak {} bytes (on a \
         {}-byte input), {:.2} s",
        ran.get(),
        tally.accepted,
        tally.peak,
        tally.len,
        start.elapsed().as_secs_f64()
    );
}

/// Up to `max` arbitrary bytes, behind one of `magics` (include an empty one for none).
pub fn arbitrary<M: AsRef<[u8]>>(magics: &[M], max: usize) -> impl Strategy<Value = Vec<u8>> {
    let magics: Vec<Vec<u8>> = magics.iter().map(|m| m.as_ref().to_vec()).collect();
    (0..magics.len(), vec(any::<u8>(), 0..max)).prop_map(move |(m, rest)| {
        let mut b = magics[m].clone();
        b.extend(rest);
        b
    })
}

/// Where an edit writes: a field offset worth hitting, or anywhere.
#[derive(Clone, Debug)]
enum At {
    Field(usize),
    Anywhere(Index),
}

/// A size field's replacement: the value, then its width in bytes and byte order.
#[derive(Clone, Debug)]
struct Wide {
    value: u64,
    width: usize,
    big_endian: bool,
}

/// One mutation of a valid input.
#[derive(Clone, Debug)]
enum Edit {
    Flip(Index, u8),
    Truncate(Index),
    Insert(Index, Vec<u8>),
    Remove(Index, usize),
    Duplicate(Index, usize),
    Inflate(At, Wide),
    Token(Index, &'static str),
    Number(Index, &'static str),
}

/// Numbers written over a decimal one in a text header (JSON, npy, CSV, TOML), which keeps
/// it well-formed but changes a size, an offset, a dimension or a setting.
const NUMBERS: &[&str] = &[
    "0",
    "1",
    "2",
    "3",
    "7",
    "255",
    "65535",
    "4294967295",
    "4294967296",
    "1099511627776",
    "9007199254740993",
    "18446744073709551615",
    "18446744073709551616",
    "-1",
    "1e3",
    "0.5",
];

/// The byte ranges of decimal digit runs in `b`.
fn digit_runs(b: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() {
            let start = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            runs.push(start..i);
        } else {
            i += 1;
        }
    }
    runs
}

fn apply(seed: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for edit in edits {
        let len = b.len();
        match edit {
            Edit::Flip(i, mask) if len > 0 => b[i.index(len)] ^= mask,
            Edit::Truncate(i) => b.truncate(i.index(len + 1)),
            Edit::Insert(i, bytes) => {
                let at = i.index(len + 1);
                b.splice(at..at, bytes.iter().copied());
            }
            Edit::Remove(i, n) if len > 0 => {
                let at = i.index(len);
                b.drain(at..(at + n).min(len));
            }
            Edit::Duplicate(i, n) if len > 0 => {
                let at = i.index(len);
                let run = b[at..(at + n).min(len)].to_vec();
                b.splice(at..at, run);
            }
            Edit::Inflate(at, wide) => {
                let at = match at {
                    At::Field(o) => *o,
                    At::Anywhere(i) if len > 0 => i.index(len),
                    At::Anywhere(_) => 0,
                };
                let bytes = if wide.big_endian {
                    wide.value.to_be_bytes()[8 - wide.width..].to_vec()
                } else {
                    wide.value.to_le_bytes()[..wide.width].to_vec()
                };
                if at + bytes.len() <= len {
                    b[at..at + bytes.len()].copy_from_slice(&bytes);
                }
            }
            Edit::Token(i, token) => {
                let at = i.index(len + 1);
                b.splice(at..at, token.bytes());
            }
            Edit::Number(i, number) => {
                let runs = digit_runs(&b);
                if !runs.is_empty() {
                    b.splice(runs[i.index(runs.len())].clone(), number.bytes());
                }
            }
            _ => {}
        }
    }
    b
}

/// One edit: a bit flip, truncation, insertion, removal, duplication, a size field (at one
/// of `fields`, or anywhere) overwritten with a huge or edge value, a `token` spliced in, a
/// decimal number replaced.
fn edit(
    fields: &'static [usize],
    tokens: &'static [&'static str],
) -> impl Strategy<Value = Edit> + Clone {
    let at = prop_oneof![
        select(fields).prop_map(At::Field),
        any::<Index>().prop_map(At::Anywhere),
    ];
    let value = select(vec![
        0u64,
        1,
        0xff,
        0xffff,
        1 << 31,
        u64::from(u32::MAX),
        1 << 32,
        1 << 40,
        1 << 62,
        u64::MAX,
    ]);
    let wide = (value, select(vec![1usize, 2, 4, 8]), any::<bool>()).prop_map(
        |(value, width, big_endian)| Wide {
            value,
            width,
            big_endian,
        },
    );
    prop_oneof![
        4 => (any::<Index>(), 1u8..=255).prop_map(|(i, m)| Edit::Flip(i, m)),
        1 => any::<Index>().prop_map(Edit::Truncate),
        2 => (any::<Index>(), vec(any::<u8>(), 1..16)).prop_map(|(i, b)| Edit::Insert(i, b)),
        2 => (any::<Index>(), 1usize..64).prop_map(|(i, n)| Edit::Remove(i, n)),
        1 => (any::<Index>(), 1usize..64).prop_map(|(i, n)| Edit::Duplicate(i, n)),
        3 => (at, wide).prop_map(|(at, wide)| Edit::Inflate(at, wide)),
        2 => (any::<Index>(), select(tokens)).prop_map(|(i, t)| Edit::Token(i, t)),
        3 => (any::<Index>(), select(NUMBERS)).prop_map(|(i, n)| Edit::Number(i, n)),
    ]
}

/// One of `seeds` with one to three [`edit`]s.
pub fn mutated(
    seeds: Vec<Vec<u8>>,
    fields: &'static [usize],
    tokens: &'static [&'static str],
) -> impl Strategy<Value = Vec<u8>> {
    (0..seeds.len(), vec(edit(fields, tokens), 1..4))
        .prop_map(move |(s, edits)| apply(&seeds[s], &edits))
}

/// One of `seeds`, made of parts (a header, its data), with one to three [`edit`]s to its
/// parts, then put together by `frame`, which writes the lengths the edited parts have: the
/// edits reach the parser past its length checks.
pub fn framed(
    seeds: Vec<Vec<Vec<u8>>>,
    tokens: &'static [&'static str],
    frame: fn(&[Vec<u8>]) -> Vec<u8>,
) -> impl Strategy<Value = Vec<u8>> {
    let edits = vec((any::<Index>(), edit(&[0], tokens)), 1..4);
    (0..seeds.len(), edits).prop_map(move |(s, edits)| {
        let mut parts = seeds[s].clone();
        for (part, edit) in edits {
            let k = part.index(parts.len());
            parts[k] = apply(&parts[k], &[edit]);
        }
        frame(&parts)
    })
}
