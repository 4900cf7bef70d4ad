//! Sparse wire encoding for tensors that are mostly zero (the pruned groups of FedSparse, FedL1
//! and FedDrop): the non-zero values plus whichever of four position codes is smallest.
//!
//! A [`crate::Record`] with `sparse` set writes each tensor in whichever form is smaller: dense
//! F32 as always, or a *blob* stored as a `U8` tensor under the tensor's own name in the same
//! safetensors container. The header metadata key `fedfuse.sparse` (value `"1"`, the format
//! version) marks such a container; without it the container is an ordinary dense record.
//!
//! # Blob format, version 1
//!
//! All integers are unsigned LEB128 varints unless said otherwise; `n` is the product of the
//! dimensions and `k` the number of stored values.
//!
//! | bytes | content |
//! |---|---|
//! | 1 | index code: `0` bitmap, `1` varint gaps, `2` Golomb-Rice gaps, `3` runs |
//! | 1, Rice only | Rice shift `b`, `0..=32` |
//! | varint | rank `r` |
//! | `r` varints | dimensions |
//! | varint | `k`, at most `n` |
//! | rest minus `4k` | index (below) |
//! | `4k` | stored values, f32 little-endian, in position order |
//!
//! Index codes, positions strictly increasing and below `n`:
//! - **bitmap**: `ceil(n / 8)` bytes, bit `p % 8` (least significant first) of byte `p / 8` set
//!   for each stored position `p`; padding bits zero; exactly `k` bits set.
//! - **varint**: `k` varints of the gaps `g_0 = p_0`, `g_i = p_i - p_(i-1) - 1`.
//! - **Rice**: the same gaps, each as `g >> b` zero bits, a one bit, then the low `b` bits of
//!   `g` (least significant first), packed least significant bit first; the final byte's
//!   unused bits are zero and no byte is left over.
//! - **runs**: pairs of varints `(z_i, s_i)`: skip `z_i` zeros, then `s_i` stored positions,
//!   until the `s_i` add up to `k` (no pairs when `k = 0`). Runs are maximal: every `s_i >= 1`
//!   and every `z_i >= 1` but the first, and they end at or before `n`. Pruning removes whole
//!   units, rows of a `[out, in]` weight, so the stored positions of a FedSparse or FedL1
//!   tensor come in a few long runs, which cost a few bytes here and `n / 8` as a bitmap
//!   (FedDrop sends its sub-model dense).
//!
//! Varints must be minimal (no trailing `0x80 .. 0x00` padding) and fit in 64 bits; the
//! blob must end exactly after the values.
//!
//! "Zero" means the bit pattern of `+0.0`: `-0.0` (and any other pattern) is a stored value,
//! so decoding gives back exactly the bits that were encoded.
//!
//! A tensor is written as a blob only when the blob is strictly smaller than its `4n` dense
//! bytes, and only while the record's blobs expand to at most [`MAX_SPARSE_VALUES`] values in
//! all; decoding refuses more, so a few hostile bytes cannot demand a huge allocation.

use std::borrow::Cow;
use std::collections::HashMap;

use safetensors::tensor::{Dtype, SafeTensors, View};

use crate::container;
use crate::{CoreError, Params, Result, Tensor};

/// Most values the sparse tensors of one record may expand to when decoded (2^28, 1 GiB of
/// f32).
///
/// A blob of a few bytes can claim an all-zero tensor of any size; this bounds the memory a
/// hostile buffer can make a decoder allocate. Dense tensors need no bound (their bytes are in
/// the buffer), so encoding writes tensors past this budget densely.
pub const MAX_SPARSE_VALUES: usize = 1 << 28;

/// Largest Rice shift: gaps of tensors up to 2^32 values need no more, and a bit reader with
/// a 64-bit window can then read the low bits in one step.
const MAX_RICE_SHIFT: u8 = 32;

const TAG_BITMAP: u8 = 0;
const TAG_VARINT: u8 = 1;
const TAG_RICE: u8 = 2;
const TAG_RUNS: u8 = 3;

/// Header metadata key marking a container that may hold sparse blobs; its value is the format
/// version.
pub(crate) const SPARSE_KEY: &str = "fedfuse.sparse";
const FORMAT_VERSION: &str = "1";

/// How a blob codes the positions of its stored values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IndexCode {
    /// One bit per position.
    Bitmap,
    /// LEB128 varints of the gaps between positions.
    Varint,
    /// Golomb-Rice code of the gaps with divisor `2^shift`.
    Rice {
        /// Number of low bits written verbatim.
        shift: u8,
    },
    /// LEB128 varints of the lengths of alternating zero and stored runs.
    Runs,
}

impl std::fmt::Display for IndexCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Bitmap => f.write_str("bitmap"),
            Self::Varint => f.write_str("varint"),
            Self::Rice { shift } => write!(f, "rice({shift})"),
            Self::Runs => f.write_str("runs"),
        }
    }
}

/// A tensor in the sparse blob format (see the [module docs](self)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SparseBlob {
    /// The blob: header, index, values.
    pub bytes: Vec<u8>,
    /// The position code chosen (the smallest).
    pub index: IndexCode,
    /// Stored values: positions whose bits are not those of `+0.0`.
    pub nonzeros: usize,
    /// Bytes before the index: code tag, Rice shift, shape and count.
    pub header_len: usize,
}

/// Encodes `tensor` as a sparse blob, with the smallest of the four position codes.
///
/// This always gives a blob; [`crate::Record::encode`] keeps a tensor dense when its blob is
/// not smaller than its 4 bytes per value.
pub fn encode_tensor(tensor: &Tensor) -> SparseBlob {
    let plan = Plan::new(tensor);
    plan.write(tensor)
}

/// Decodes a sparse blob into a dense tensor, zeros filled in as `+0.0`.
///
/// Any malformed blob is an error, never a panic; tensors over [`MAX_SPARSE_VALUES`] values
/// are refused.
pub fn decode_tensor(blob: &[u8]) -> Result<Tensor> {
    decode_blob(blob, MAX_SPARSE_VALUES).map_err(|reason| CoreError::Decode {
        what: "sparse tensor".into(),
        reason,
    })
}

/// `log2` of the binomial coefficient `C(n, k)`: the bits needed to say which `k` of `n`
/// positions are chosen. Summed as logs of exact ratios (no `lgamma`); `-inf` when `k > n`.
pub fn log2_binomial(n: usize, k: usize) -> f64 {
    if k > n {
        return f64::NEG_INFINITY;
    }
    let k = k.min(n - k);
    let base = (n - k) as f64;
    let ln: f64 = (1..=k)
        .map(|i| {
            let i = i as f64;
            ((base + i) / i).ln()
        })
        .sum();
    ln / std::f64::consts::LN_2
}

/// The information bound for `k` stored f32 values among `n` positions, in bits:
/// `ceil(log2 C(n, k)) + 32 k`.
pub fn information_bound_bits(n: usize, k: usize) -> f64 {
    // The tiny slack absorbs summation error where C(n, k) is an exact power of two.
    (log2_binomial(n, k) - 1e-9).ceil().max(0.0) + 32.0 * k as f64
}

/// What encoding a tensor takes, decided before writing anything.
struct Plan {
    positions: Vec<usize>,
    index: IndexCode,
    index_len: usize,
}

impl Plan {
    fn new(tensor: &Tensor) -> Self {
        let n = tensor.data.len();
        let positions: Vec<usize> = tensor
            .data
            .iter()
            .enumerate()
            .filter(|(_, v)| v.to_bits() != 0)
            .map(|(p, _)| p)
            .collect();
        let bitmap = n.div_ceil(8);
        let varint: usize = gaps(&positions).map(varint_len).sum();
        let (shift, rice_bits) = best_rice_shift(&positions);
        // The shift byte sits in the header but is the Rice code's cost, so it counts here.
        let rice =
            usize::try_from(rice_bits.div_ceil(8)).map_or(usize::MAX, |b| b.saturating_add(1));
        let runs: usize = runs(&positions)
            .map(|(z, s)| varint_len(z) + varint_len(s))
            .sum();
        // Ties go to the simpler code (the first).
        let (index, index_len) = [
            (IndexCode::Bitmap, bitmap),
            (IndexCode::Varint, varint),
            (IndexCode::Runs, runs),
            (IndexCode::Rice { shift }, rice),
        ]
        .into_iter()
        .min_by_key(|&(_, len)| len)
        .unwrap_or((IndexCode::Bitmap, bitmap));
        Self {
            positions,
            index,
            index_len,
        }
    }

    /// Bytes of the blob this plan writes.
    fn blob_len(&self, tensor: &Tensor) -> usize {
        self.header_len(tensor)
            .saturating_add(self.index_len)
            .saturating_add(self.positions.len().saturating_mul(4))
    }

    fn header_len(&self, tensor: &Tensor) -> usize {
        let dims: usize = tensor.shape.iter().map(|&d| varint_len(d as u64)).sum();
        // The Rice shift byte is counted in index_len.
        1 + varint_len(tensor.shape.len() as u64) + dims + varint_len(self.positions.len() as u64)
    }

    fn write(self, tensor: &Tensor) -> SparseBlob {
        let mut out = Vec::with_capacity(self.blob_len(tensor));
        match self.index {
            IndexCode::Bitmap => out.push(TAG_BITMAP),
            IndexCode::Varint => out.push(TAG_VARINT),
            IndexCode::Rice { shift } => out.extend([TAG_RICE, shift]),
            IndexCode::Runs => out.push(TAG_RUNS),
        }
        put_varint(&mut out, tensor.shape.len() as u64);
        for &d in &tensor.shape {
            put_varint(&mut out, d as u64);
        }
        put_varint(&mut out, self.positions.len() as u64);
        let header_len = out.len();
        match self.index {
            IndexCode::Bitmap => {
                let start = out.len();
                out.resize(start + tensor.data.len().div_ceil(8), 0);
                for &p in &self.positions {
                    out[start + p / 8] |= 1 << (p % 8);
                }
            }
            IndexCode::Varint => {
                for g in gaps(&self.positions) {
                    put_varint(&mut out, g);
                }
            }
            IndexCode::Rice { shift } => {
                let mut w = BitWriter::new(out);
                let mask = (1u64 << shift) - 1;
                for g in gaps(&self.positions) {
                    w.unary(g >> shift);
                    w.push(g & mask, u32::from(shift));
                }
                out = w.finish();
            }
            IndexCode::Runs => {
                for (z, s) in runs(&self.positions) {
                    put_varint(&mut out, z);
                    put_varint(&mut out, s);
                }
            }
        }
        for &p in &self.positions {
            out.extend(tensor.data[p].to_le_bytes());
        }
        SparseBlob {
            bytes: out,
            index: self.index,
            nonzeros: self.positions.len(),
            header_len,
        }
    }
}

/// Gaps between strictly increasing positions: `p_0`, then `p_i - p_(i-1) - 1`.
fn gaps(positions: &[usize]) -> impl Iterator<Item = u64> + '_ {
    let mut next = 0usize;
    positions.iter().map(move |&p| {
        let g = p - next;
        next = p + 1;
        g as u64
    })
}

/// Maximal runs of strictly increasing positions, as (zeros before the run, run length).
fn runs(positions: &[usize]) -> impl Iterator<Item = (u64, u64)> + '_ {
    let mut i = 0;
    let mut next = 0usize;
    std::iter::from_fn(move || {
        let start = *positions.get(i)?;
        let mut end = start + 1;
        i += 1;
        while positions.get(i) == Some(&end) {
            end += 1;
            i += 1;
        }
        let zeros = start - next;
        next = end;
        Some((zeros as u64, (end - start) as u64))
    })
}

/// The Rice shift that codes these gaps in the fewest bits, and that many bits.
///
/// The cost `k (b + 1) + sum(g >> b)` is convex in `b` (each step saves
/// `sum(ceil((g >> b) / 2))`, which only shrinks), so walking downhill from the shift the
/// mean gap suggests finds the optimum in a few passes.
fn best_rice_shift(positions: &[usize]) -> (u8, u128) {
    let k = positions.len() as u128;
    let cost = |b: u8| -> u128 {
        let quotients: u128 = gaps(positions).map(|g| u128::from(g >> b)).sum();
        k * (u128::from(b) + 1) + quotients
    };
    let mean = gaps(positions).map(u128::from).sum::<u128>() / k.max(1);
    let mut b = u8::try_from(u128::BITS - mean.leading_zeros())
        .unwrap_or(MAX_RICE_SHIFT)
        .min(MAX_RICE_SHIFT);
    let mut best = cost(b);
    while b < MAX_RICE_SHIFT {
        let c = cost(b + 1);
        if c >= best {
            break;
        }
        (b, best) = (b + 1, c);
    }
    while b > 0 {
        let c = cost(b - 1);
        if c > best {
            break;
        }
        (b, best) = (b - 1, c);
    }
    (b, best)
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends bits least significant first.
struct BitWriter {
    out: Vec<u8>,
    acc: u64,
    nbits: u32,
}

impl BitWriter {
    fn new(out: Vec<u8>) -> Self {
        Self {
            out,
            acc: 0,
            nbits: 0,
        }
    }

    /// Appends the low `count` (at most 32) bits of `value`.
    fn push(&mut self, value: u64, count: u32) {
        self.acc |= value << self.nbits;
        self.nbits += count;
        while self.nbits >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.nbits -= 8;
        }
    }

    /// `q` zero bits, then a one.
    fn unary(&mut self, mut q: u64) {
        while q >= 32 {
            self.push(0, 32);
            q -= 32;
        }
        self.push(1 << q, q as u32 + 1);
    }

    fn finish(mut self) -> Vec<u8> {
        if self.nbits > 0 {
            self.out.push(self.acc as u8);
        }
        self.out
    }
}

/// Why a blob is malformed.
type Fallible<T> = std::result::Result<T, String>;

/// Reads bytes and varints, failing at the end of the input.
struct ByteReader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> ByteReader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn byte(&mut self, what: &str) -> Fallible<u8> {
        let b = *self
            .bytes
            .get(self.pos)
            .ok_or_else(|| format!("ends before the {what}"))?;
        self.pos += 1;
        Ok(b)
    }

    fn varint(&mut self, what: &str) -> Fallible<u64> {
        let mut v = 0u64;
        let mut shift = 0u32;
        loop {
            let b = self.byte(what)?;
            let low = u64::from(b & 0x7f);
            // The tenth byte may only hold the top bit of a u64.
            if shift == 63 && low > 1 {
                return Err(format!("{what} overflows 64 bits"));
            }
            v |= low << shift;
            if b & 0x80 == 0 {
                if b == 0 && shift > 0 {
                    return Err(format!("{what} is not minimally encoded"));
                }
                return Ok(v);
            }
            shift += 7;
            if shift > 63 {
                return Err(format!("{what} overflows 64 bits"));
            }
        }
    }

    fn usize(&mut self, what: &str) -> Fallible<usize> {
        let v = self.varint(what)?;
        usize::try_from(v).map_err(|_| format!("{what} {v} does not fit in memory"))
    }
}

/// Reads bits least significant first, through a 64-bit window.
struct BitReader<'a> {
    bytes: &'a [u8],
    pos: usize,
    acc: u64,
    nbits: u32,
}

impl<'a> BitReader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self {
            bytes,
            pos: 0,
            acc: 0,
            nbits: 0,
        }
    }

    fn refill(&mut self) {
        while self.nbits <= 56 {
            let Some(&b) = self.bytes.get(self.pos) else {
                break;
            };
            self.acc |= u64::from(b) << self.nbits;
            self.nbits += 8;
            self.pos += 1;
        }
    }

    /// Drops `count` (at most `nbits`) bits.
    fn consume(&mut self, count: u32) {
        self.acc = self.acc.checked_shr(count).unwrap_or(0);
        self.nbits -= count;
    }

    /// Zero bits up to the next one bit, refusing runs longer than `limit`.
    fn unary(&mut self, limit: u64) -> Fallible<u64> {
        let mut q = 0u64;
        loop {
            self.refill();
            if self.acc != 0 {
                // Bits above nbits are zero, so the lowest set bit is a real one.
                let tz = self.acc.trailing_zeros();
                q += u64::from(tz);
                if q > limit {
                    return Err("a Rice gap runs past the tensor's end".into());
                }
                self.consume(tz + 1);
                return Ok(q);
            }
            if self.nbits == 0 {
                return Err("the Rice index ends inside a gap".into());
            }
            q += u64::from(self.nbits);
            self.consume(self.nbits);
            if q > limit {
                return Err("a Rice gap runs past the tensor's end".into());
            }
        }
    }

    /// The next `count` (at most 32) bits.
    fn bits(&mut self, count: u32) -> Fallible<u64> {
        if count == 0 {
            return Ok(0);
        }
        self.refill();
        if self.nbits < count {
            return Err("the Rice index ends inside a gap".into());
        }
        let v = self.acc & ((1u64 << count) - 1);
        self.consume(count);
        Ok(v)
    }

    /// Checks that only the final byte's zero padding is left.
    fn finish(mut self) -> Fallible<()> {
        self.refill();
        if self.nbits >= 8 {
            return Err("the Rice index has bytes left over".into());
        }
        if self.acc != 0 {
            return Err("the Rice index's padding bits are not zero".into());
        }
        Ok(())
    }
}

/// Decodes a blob whose tensor may hold at most `budget` values.
pub(crate) fn decode_blob(blob: &[u8], budget: usize) -> Fallible<Tensor> {
    let mut r = ByteReader::new(blob);
    let index = match r.byte("index code")? {
        TAG_BITMAP => IndexCode::Bitmap,
        TAG_VARINT => IndexCode::Varint,
        TAG_RICE => {
            let shift = r.byte("Rice shift")?;
            if shift > MAX_RICE_SHIFT {
                return Err(format!(
                    "Rice shift {shift} exceeds the largest, {MAX_RICE_SHIFT}"
                ));
            }
            IndexCode::Rice { shift }
        }
        TAG_RUNS => IndexCode::Runs,
        tag => return Err(format!("unknown index code {tag}")),
    };
    let rank = r.usize("rank")?;
    // Each dimension takes at least a byte: this bounds the allocation below.
    if rank > r.remaining() {
        return Err(format!("rank {rank} exceeds the bytes left"));
    }
    let mut shape = Vec::with_capacity(rank);
    let mut n = 1usize;
    for _ in 0..rank {
        let d = r.usize("dimension")?;
        n = n
            .checked_mul(d)
            .ok_or_else(|| "the shape's size overflows".to_string())?;
        shape.push(d);
    }
    if n > budget {
        return Err(format!(
            "shape {shape:?} holds {n} values, over the {budget} left of the sparse limit"
        ));
    }
    let k = r.usize("value count")?;
    if k > n {
        return Err(format!("{k} stored values exceed the {n} positions"));
    }
    let index_end = k
        .checked_mul(4)
        .and_then(|len| blob.len().checked_sub(len))
        .filter(|&end| end >= r.pos)
        .ok_or_else(|| format!("too short for {k} values"))?;
    let index_bytes = &blob[r.pos..index_end];
    let mut values = blob[index_end..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
    let mut data = vec![0f32; n];
    let mut put = |p: usize| -> Fallible<()> {
        match (data.get_mut(p), values.next()) {
            (Some(slot), Some(v)) => {
                *slot = v;
                Ok(())
            }
            (None, _) => Err(format!("position {p} is outside the {n} values")),
            (_, None) => Err("more positions than values".into()),
        }
    };
    match index {
        IndexCode::Bitmap => {
            if index_bytes.len() != n.div_ceil(8) {
                return Err(format!(
                    "bitmap of {} bytes where {n} positions need {}",
                    index_bytes.len(),
                    n.div_ceil(8)
                ));
            }
            if let (Some(&last), tail @ 1..) = (index_bytes.last(), n % 8)
                && last >> tail != 0
            {
                return Err("the bitmap's padding bits are not zero".into());
            }
            let set: usize = index_bytes.iter().map(|b| b.count_ones() as usize).sum();
            if set != k {
                return Err(format!("bitmap marks {set} positions for {k} values"));
            }
            for (i, &byte) in index_bytes.iter().enumerate() {
                let mut bits = byte;
                while bits != 0 {
                    put(i * 8 + bits.trailing_zeros() as usize)?;
                    bits &= bits - 1;
                }
            }
        }
        IndexCode::Varint => {
            let mut ix = ByteReader::new(index_bytes);
            let mut next = 0u64;
            for _ in 0..k {
                let p = next
                    .checked_add(ix.varint("gap")?)
                    .filter(|&p| p < n as u64)
                    .ok_or_else(|| format!("a position runs past the {n} values"))?;
                put(p as usize)?;
                next = p + 1;
            }
            if ix.remaining() != 0 {
                return Err("the varint index has bytes left over".into());
            }
        }
        IndexCode::Rice { shift } => {
            let mut bits = BitReader::new(index_bytes);
            let limit = (n as u64) >> shift;
            let mut next = 0u64;
            for _ in 0..k {
                let q = bits.unary(limit)?;
                let low = bits.bits(u32::from(shift))?;
                // q <= n >> shift, so this neither overflows nor loses bits.
                let gap = (q << shift) | low;
                let p = next
                    .checked_add(gap)
                    .filter(|&p| p < n as u64)
                    .ok_or_else(|| format!("a position runs past the {n} values"))?;
                put(p as usize)?;
                next = p + 1;
            }
            bits.finish()?;
        }
        IndexCode::Runs => {
            let mut ix = ByteReader::new(index_bytes);
            let (mut next, mut stored) = (0u64, 0u64);
            while stored < k as u64 {
                let zeros = ix.varint("zero run")?;
                let run = ix.varint("stored run")?;
                if run == 0 || (zeros == 0 && stored > 0) {
                    return Err("the runs are not maximal (an empty run)".into());
                }
                // A run is at most k values long, so a bad one fails here, before the loop.
                let start = next
                    .checked_add(zeros)
                    .filter(|&p| p < n as u64)
                    .ok_or_else(|| format!("a run starts past the {n} values"))?;
                let end = start
                    .checked_add(run)
                    .filter(|&e| e <= n as u64 && stored + run <= k as u64)
                    .ok_or_else(|| format!("a run ends past the {n} values or the {k} stored"))?;
                for p in start..end {
                    put(p as usize)?;
                }
                (next, stored) = (end, stored + run);
            }
            if ix.remaining() != 0 {
                return Err("the run index has bytes left over".into());
            }
        }
    }
    Ok(Tensor { shape, data })
}

/// A tensor as the container holds it.
enum Wire<'a> {
    Dense(&'a Tensor),
    Blob { bytes: Vec<u8>, shape: [usize; 1] },
}

impl View for Wire<'_> {
    fn dtype(&self) -> Dtype {
        match self {
            Self::Dense(_) => Dtype::F32,
            Self::Blob { .. } => Dtype::U8,
        }
    }
    fn shape(&self) -> &[usize] {
        match self {
            Self::Dense(t) => &t.shape,
            Self::Blob { shape, .. } => shape,
        }
    }
    fn data(&self) -> Cow<'_, [u8]> {
        match self {
            Self::Dense(t) => container::le_bytes(t),
            Self::Blob { bytes, .. } => Cow::Borrowed(bytes),
        }
    }
    fn data_len(&self) -> usize {
        match self {
            Self::Dense(t) => t.data.len() * 4,
            Self::Blob { bytes, .. } => bytes.len(),
        }
    }
}

/// `t` as a sparse blob when that is smaller than dense f32, counting its values against
/// `budget` (the decoder's [`MAX_SPARSE_VALUES`] per record); `None` to send it dense.
pub fn blob_if_smaller(t: &Tensor, budget: &mut usize) -> Option<Vec<u8>> {
    let n = t.data.len();
    let nonzeros = t.data.iter().filter(|v| v.to_bits() != 0).count();
    // With every value stored, a blob only adds its index and header.
    if n > *budget || nonzeros == n {
        return None;
    }
    let plan = Plan::new(t);
    if plan.blob_len(t) >= n.saturating_mul(4) {
        return None;
    }
    *budget -= n;
    Some(plan.write(t).bytes)
}

/// Encodes `params` with each tensor dense or sparse, whichever is smaller, and `metadata` in
/// the header.
pub(crate) fn params_to_container(
    params: &Params,
    mut metadata: HashMap<String, String>,
) -> Result<Vec<u8>> {
    metadata.insert(SPARSE_KEY.to_string(), FORMAT_VERSION.to_string());
    let mut budget = MAX_SPARSE_VALUES;
    let mut views = Vec::with_capacity(params.len());
    for (name, t) in params.iter() {
        let wire = match blob_if_smaller(t, &mut budget) {
            Some(bytes) => Wire::Blob {
                shape: [bytes.len()],
                bytes,
            },
            None => Wire::Dense(t),
        };
        views.push((name.to_string(), wire));
    }
    container::serialize(params, views, metadata)
}

/// True when `bytes` is a safetensors container marked as possibly holding sparse blobs.
pub(crate) fn is_sparse_container(bytes: &[u8]) -> bool {
    SafeTensors::read_metadata(bytes).is_ok_and(|(_, header)| {
        header
            .metadata()
            .as_ref()
            .is_some_and(|m| m.contains_key(SPARSE_KEY))
    })
}

/// Decodes a container written by [`params_to_container`]: tensors in their recorded order,
/// dense, and the header metadata other than order and format version.
pub(crate) fn params_from_container(bytes: &[u8]) -> Result<(Params, HashMap<String, String>)> {
    let bad = |what: &str, reason: String| CoreError::Decode {
        what: what.to_string(),
        reason,
    };
    let container::Container {
        tensors: st,
        mut metadata,
        order,
    } = container::parse(bytes)?;
    match metadata.remove(SPARSE_KEY) {
        Some(v) if v == FORMAT_VERSION => {}
        Some(v) => {
            return Err(bad(
                "sparse record",
                format!("format version `{v}`; this build reads `{FORMAT_VERSION}`"),
            ));
        }
        None => {
            return Err(bad(
                "sparse record",
                format!("header metadata lacks `{SPARSE_KEY}`"),
            ));
        }
    }
    let names = order.ok_or_else(|| {
        bad(
            "sparse record",
            format!("header metadata lacks `{}`", container::ORDER_KEY),
        )
    })?;
    let mut budget = MAX_SPARSE_VALUES;
    let mut params = Params::new();
    for name in names {
        let view = st
            .tensor(&name)
            .map_err(|e| bad(&format!("tensor `{name}`"), e.to_string()))?;
        let (shape, data) = match (view.dtype(), view.shape()) {
            (Dtype::F32, shape) => (
                shape.to_vec(),
                view.data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            (Dtype::U8, [_]) => {
                let t = decode_blob(view.data(), budget)
                    .map_err(|reason| bad(&format!("sparse tensor `{name}`"), reason))?;
                budget -= t.data.len();
                (t.shape, t.data)
            }
            (dtype, shape) => {
                return Err(bad(
                    &format!("tensor `{name}`"),
                    format!("{dtype:?} {shape:?} is neither dense F32 nor a 1-D U8 sparse blob"),
                ));
            }
        };
        params.push(name, shape, data)?;
    }
    Ok((params, metadata))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(shape: Vec<usize>, data: Vec<f32>) -> Tensor {
        Tensor::new("t", shape, data).unwrap()
    }

    fn reason(blob: &[u8]) -> String {
        decode_tensor(blob).unwrap_err().to_string()
    }

    #[test]
    fn varints_round_trip_and_refuse_overlong_and_overflow() {
        for v in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            assert_eq!(b.len(), varint_len(v));
            let mut r = ByteReader::new(&b);
            assert_eq!(r.varint("x").unwrap(), v);
            assert_eq!(r.remaining(), 0);
        }
        let overlong = ByteReader::new(&[0x80, 0x00]).varint("x").unwrap_err();
        assert!(overlong.contains("minimal"), "{overlong}");
        let mut big = vec![0xff; 9];
        big.push(0x02);
        let over = ByteReader::new(&big).varint("x").unwrap_err();
        assert!(over.contains("overflows"), "{over}");
        let long = ByteReader::new(&[0xff; 11]).varint("x").unwrap_err();
        assert!(long.contains("overflows"), "{long}");
        assert!(ByteReader::new(&[0x80]).varint("x").is_err());
    }

    #[test]
    fn each_code_wins_where_it_should() {
        let n = 4096;
        let every = |step: usize| {
            let data = (0..n)
                .map(|i| if i % step == 0 { 1.0 } else { 0.0 })
                .collect();
            encode_tensor(&tensor(vec![n], data)).index
        };
        // Half full: a bit per position is the entropy.
        assert_eq!(every(2), IndexCode::Bitmap);
        // Regular gaps of 99 fit in one varint byte with nothing to spare.
        assert_eq!(every(100), IndexCode::Varint);
        let mut data = vec![0.0; n];
        for p in [3, 700, 1500, 1510, 4000] {
            data[p] = -2.0;
        }
        assert!(matches!(
            encode_tensor(&tensor(vec![n], data)).index,
            IndexCode::Rice { .. } | IndexCode::Varint
        ));
        assert_eq!(
            encode_tensor(&tensor(vec![8], vec![0.0; 8])).index,
            IndexCode::Varint
        );
    }

    #[test]
    fn rice_shift_is_the_exhaustive_optimum() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for density in [0.001, 0.02, 0.3, 0.7] {
            let positions: Vec<usize> = (0..20_000)
                .filter(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed >> 11) as f64 / (1u64 << 53) as f64 <= density
                })
                .collect();
            let (b, bits) = best_rice_shift(&positions);
            let k = positions.len() as u128;
            let all = (0..=MAX_RICE_SHIFT).map(|s| {
                k * (u128::from(s) + 1) + gaps(&positions).map(|g| u128::from(g >> s)).sum::<u128>()
            });
            assert_eq!(bits, all.min().unwrap(), "density {density}, shift {b}");
        }
    }

    #[test]
    fn blob_layout_is_as_documented() {
        // Positions 1 and 9 of [2, 5]: every code takes 2 bytes here, and ties go to the bitmap.
        let mut data = vec![0.0; 10];
        data[1] = 1.0;
        data[9] = -0.0;
        let blob = encode_tensor(&tensor(vec![2, 5], data));
        let mut want = vec![TAG_BITMAP, 2, 2, 5, 2, 0b0000_0010, 0b0000_0010];
        want.extend(1f32.to_le_bytes());
        want.extend((-0f32).to_le_bytes());
        assert_eq!(blob.bytes, want);
        assert_eq!((blob.header_len, blob.nonzeros), (5, 2));
    }

    #[test]
    fn malformed_blobs_are_errors() {
        let one = 1f32.to_le_bytes();
        let with_values = |head: &[u8], count: usize| {
            let mut b = head.to_vec();
            for _ in 0..count {
                b.extend(one);
            }
            b
        };
        assert!(reason(&[]).contains("index code"));
        assert!(reason(&[9, 1, 4, 0]).contains("unknown index code 9"));
        assert!(reason(&[TAG_RICE, 33, 1, 4, 0]).contains("Rice shift 33"));
        assert!(reason(&[TAG_VARINT, 200, 1]).contains("rank"));
        // 2^40 * 2^40 overflows a 64-bit size.
        let huge = [0x80, 0x80, 0x80, 0x80, 0x80, 0x20];
        let mut b = vec![TAG_VARINT, 2];
        b.extend(huge);
        b.extend(huge);
        b.push(0);
        assert!(reason(&b).contains("overflows"));
        // A few bytes may not claim a tensor over the limit.
        let mut b = vec![TAG_VARINT, 1];
        put_varint(&mut b, MAX_SPARSE_VALUES as u64 + 1);
        b.push(0);
        assert!(reason(&b).contains("sparse limit"));
        assert!(reason(&with_values(&[TAG_VARINT, 1, 2, 3, 0, 0, 0], 3)).contains("exceed"));
        assert!(reason(&with_values(&[TAG_VARINT, 1, 4, 2, 0], 1)).contains("too short"));
        // Positions past the end, for each code.
        assert!(reason(&with_values(&[TAG_VARINT, 1, 4, 1, 4], 1)).contains("past"));
        assert!(reason(&with_values(&[TAG_VARINT, 1, 4, 2, 2, 1], 2)).contains("past"));
        assert!(reason(&with_values(&[TAG_RICE, 0, 1, 4, 1, 0b1_0000], 1)).contains("past"));
        assert!(reason(&with_values(&[TAG_BITMAP, 1, 4, 1, 0b1_0000], 1)).contains("padding"));
        // Counts that disagree with the index.
        assert!(reason(&with_values(&[TAG_BITMAP, 1, 4, 1, 0b11], 1)).contains("marks 2"));
        assert!(reason(&with_values(&[TAG_BITMAP, 1, 4, 1, 1, 0], 1)).contains("bitmap of 2"));
        assert!(reason(&with_values(&[TAG_VARINT, 1, 4, 1, 0, 0], 1)).contains("left over"));
        assert!(reason(&with_values(&[TAG_RICE, 0, 1, 4, 1, 1, 0], 1)).contains("left over"));
        assert!(reason(&with_values(&[TAG_RICE, 0, 1, 4, 1, 0b11], 1)).contains("padding"));
        assert!(reason(&with_values(&[TAG_RICE, 1, 1, 64, 1, 0x80], 1)).contains("ends inside"));
        assert!(reason(&with_values(&[TAG_RICE, 0, 1, 64, 1, 0], 1)).contains("ends inside"));
        assert!(reason(&with_values(&[TAG_RICE, 0, 1, 4, 1, 0], 1)).contains("past"));
        // Runs: empty, past the end, longer than the count, unfinished or with bytes left.
        assert!(reason(&with_values(&[TAG_RUNS, 1, 4, 1, 0, 0], 1)).contains("not maximal"));
        assert!(reason(&with_values(&[TAG_RUNS, 1, 4, 2, 0, 1, 0, 1], 2)).contains("not maximal"));
        assert!(reason(&with_values(&[TAG_RUNS, 1, 4, 1, 4, 1], 1)).contains("starts past"));
        assert!(reason(&with_values(&[TAG_RUNS, 1, 4, 2, 3, 2], 2)).contains("ends past"));
        assert!(reason(&with_values(&[TAG_RUNS, 1, 4, 1, 0, 2], 1)).contains("ends past"));
        assert!(reason(&with_values(&[TAG_RUNS, 1, 4, 2, 0, 1], 2)).contains("ends before"));
        assert!(reason(&with_values(&[TAG_RUNS, 1, 4, 1, 0, 1, 0], 1)).contains("left over"));
        let t = decode_tensor(&with_values(&[TAG_RUNS, 1, 5, 3, 0, 1, 2, 2], 3)).unwrap();
        assert_eq!(t.data, vec![1.0, 0.0, 0.0, 1.0, 1.0]);
        // And well-formed ones decode.
        let t = decode_tensor(&with_values(&[TAG_RICE, 1, 1, 4, 1, 0b110], 1)).unwrap();
        assert_eq!(t.data, vec![0.0, 0.0, 0.0, 1.0]);
        let t = decode_tensor(&with_values(&[TAG_VARINT, 1, 4, 2, 1, 1], 2)).unwrap();
        assert_eq!(t.data, vec![0.0, 1.0, 0.0, 1.0]);
        let t = decode_tensor(&[TAG_VARINT, 0, 0]).unwrap();
        assert_eq!((t.shape, t.data), (vec![], vec![0.0]));
    }

    #[test]
    fn binomial_logs_are_exact_enough() {
        assert_eq!(log2_binomial(10, 0), 0.0);
        assert!((log2_binomial(10, 3) - 120f64.log2()).abs() < 1e-12);
        assert!((log2_binomial(10, 7) - 120f64.log2()).abs() < 1e-12);
        assert!((log2_binomial(64, 32) - 1_832_624_140_942_590_534f64.log2()).abs() < 1e-9);
        assert_eq!(log2_binomial(3, 4), f64::NEG_INFINITY);
        // C(4, 2) = 6: ceil(log2 6) = 3 bits, plus two values.
        assert_eq!(information_bound_bits(4, 2), 3.0 + 64.0);
        assert_eq!(information_bound_bits(8, 1), 3.0 + 32.0);
    }
}
