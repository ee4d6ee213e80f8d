//! F32, F16 and BF16 weights row after row, and the chunking of their products: F32 and
//! F16 with AVX-512 or AVX2 through the tiles of `float_simd`, BF16 with AVX512-BF16
//! through those of `bf16_simd`, otherwise the portable kernels of `float` (their
//! arithmetic, and so their results, the same).

use std::ops::Range;

use half::{bf16, f16};

use super::float;
#[cfg(target_arch = "x86_64")]
use super::float_simd;
use super::layout::Layout;
use super::output::Columns;
use super::{Activations, RowKernel};

/// The results of `$body`, a tile of up to [`float_simd::TILE_X`] activation rows, with
/// the constant `$c` set to `$n`, the tile's height (1 to `TILE_X`), in the first `$n`
/// rows of a full tile's array.
#[cfg(target_arch = "x86_64")]
macro_rules! tile_of {
    ($n:expr, $c:ident => $body:expr) => {
        tile_of!($n, $c => $body; 1 2 3 4 5 6)
    };
    ($n:expr, $c:ident => $body:expr; $($h:literal)*) => {{
        let mut got = [[0f32; float_simd::TILE_W]; float_simd::TILE_X];
        match $n {
            $($h => {
                const $c: usize = $h;
                got[..$h].copy_from_slice(&$body)
            })*
            n => unreachable!("{n} activation rows in a tile"),
        }
        got
    }};
}

/// A float weight type as the file stores it.
pub trait FloatWeight: Copy + Send + Sync + 'static {
    /// The value of its little-endian bytes.
    fn from_le(bytes: &[u8]) -> Self;
    /// Bytes per value.
    const BYTES: usize;
}

impl FloatWeight for f32 {
    fn from_le(b: &[u8]) -> Self {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
    const BYTES: usize = 4;
}

impl FloatWeight for f16 {
    fn from_le(b: &[u8]) -> Self {
        f16::from_le_bytes([b[0], b[1]])
    }
    const BYTES: usize = 2;
}

impl FloatWeight for bf16 {
    fn from_le(b: &[u8]) -> Self {
        bf16::from_le_bytes([b[0], b[1]])
    }
    const BYTES: usize = 2;
}

/// A float matrix, row after row.
pub struct FloatRows<W> {
    values: Vec<W>,
    cols: usize,
}

impl<W: FloatWeight> FloatRows<W> {
    /// The matrix of the file's bytes (rows of `cols` values).
    pub fn new(data: &[u8], cols: usize) -> Self {
        Self {
            values: data.chunks_exact(W::BYTES).map(W::from_le).collect(),
            cols,
        }
    }
}

/// The activations of an F32 matrix: its rows as they are.
fn float_activations(acts: &Activations) -> &[f32] {
    match acts {
        Activations::Float(x) => x,
        _ => unreachable!("F32 weights take f32 activations"),
    }
}

/// The activations of a BF16 matrix: its rows rounded to BF16 (as f32), and the same as
/// BF16 where any row is batched (empty otherwise).
fn brain_activations(acts: &Activations) -> (&[f32], &[bf16]) {
    match acts {
        Activations::Brain(x, narrowed) => (x, narrowed),
        _ => unreachable!("BF16 weights take BF16 activations"),
    }
}

/// The activations of an F16 matrix: its rows rounded to F16.
fn half_activations(acts: &Activations) -> &[f16] {
    match acts {
        Activations::Half(x) => x,
        _ => unreachable!("F16 weights take F16 activations"),
    }
}

/// The F32 and F16 weights' activations and portable kernels (BF16's have no four-row
/// form).
trait FloatKernels: FloatWeight + Into<f32> + WidenSimd {
    /// The type the activations meet the weights in (the weights' own).
    type Act: Copy + Into<f32> + WidenSimd + Sync;
    /// The activation rows, row-major, in `Act`. F16 tiles widen theirs as they load them:
    /// on a Zen 5 that ran a 1B F16 prefill a fifth faster than tiles of activations
    /// widened to f32 once per product (half the bytes from the second-level cache per
    /// tile); on a Zen 4 it was a few percent slower.
    fn activations(acts: &Activations) -> &[Self::Act];
    /// One row's product.
    const DOT: FloatDot<Self, Self::Act>;
    /// Four rows' products.
    const DOT4: FloatDot4<Self, Self::Act>;
}

impl FloatKernels for f32 {
    type Act = f32;
    fn activations(acts: &Activations) -> &[f32] {
        float_activations(acts)
    }
    const DOT: FloatDot<Self, f32> = float::dot_f32;
    const DOT4: FloatDot4<Self, f32> = float::dot4_f32;
}

impl FloatKernels for f16 {
    type Act = f16;
    fn activations(acts: &Activations) -> &[f16] {
        half_activations(acts)
    }
    const DOT: FloatDot<Self, f16> = float::dot_f16;
    const DOT4: FloatDot4<Self, f16> = float::dot4_f16;
}

impl<W: FloatKernels> Layout for FloatRows<W> {
    fn back_with_huge_pages(&self) {
        crate::huge_pages::back(&self.values);
    }

    fn chunk(&self, acts: &Activations, kernels: &[RowKernel], range: Range<usize>, out: &Columns) {
        let x = W::activations(acts);
        let (w, cols) = (&self.values, self.cols);
        float_rows(w, x, cols, range, kernels, out, W::DOT, W::DOT4);
    }
}

impl Layout for FloatRows<bf16> {
    fn back_with_huge_pages(&self) {
        crate::huge_pages::back(&self.values);
    }

    fn chunk(&self, acts: &Activations, kernels: &[RowKernel], range: Range<usize>, out: &Columns) {
        let (x, narrowed) = brain_activations(acts);
        let cols = self.cols;
        #[cfg(target_arch = "x86_64")]
        if crate::simd::bf16() {
            // SAFETY: the CPU has AVX512-BF16 (checked just above).
            return unsafe {
                bf16_rows_simd(&self.values, (x, narrowed), cols, range, kernels, out)
            };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = narrowed;
        for r in range {
            let w = &self.values[r * cols..(r + 1) * cols];
            for (t, &kernel) in kernels.iter().enumerate() {
                let x = &x[t * cols..(t + 1) * cols];
                out.set(t, r, float::dot_bf16(w, x, kernel.batched()));
            }
        }
    }
}

/// [`FloatRows<bf16>`]'s products with AVX512-BF16: lone rows through the vector dot
/// product's kernel, batched rows in tiles of four weight rows by up to six activation rows
/// (rows past the last whole four through the portable kernel).
///
/// # Safety
/// The CPU must have AVX512-BF16 ([`crate::simd::bf16`]).
#[cfg(target_arch = "x86_64")]
unsafe fn bf16_rows_simd(
    w: &[bf16],
    (x, narrowed): (&[f32], &[bf16]),
    cols: usize,
    range: Range<usize>,
    kernels: &[RowKernel],
    out: &Columns,
) {
    use super::bf16_simd;
    use float_simd::TILE_W;
    let row = |r: usize| &w[r * cols..(r + 1) * cols];
    let act = |t: usize| &x[t * cols..(t + 1) * cols];
    let (lone, batched): (Vec<usize>, Vec<usize>) =
        (0..kernels.len()).partition(|&t| !kernels[t].batched());
    for &t in &lone {
        for r in range.clone() {
            // SAFETY: the caller checked that the CPU has AVX512-BF16.
            out.set(t, r, unsafe { bf16_simd::lone(row(r), act(t)) });
        }
    }
    // Tiles need whole blocks of 32 (every BF16 matrix ferrite takes has them).
    let tiled = match cols.is_multiple_of(32) {
        true => range.start..range.start + range.len() / TILE_W * TILE_W,
        false => range.start..range.start,
    };
    let narrow = |t: usize| &narrowed[t * cols..(t + 1) * cols];
    tiled_products(&batched, tiled.clone(), out, |r, ts| {
        let ws: [&[bf16]; TILE_W] = std::array::from_fn(|i| row(r + i));
        // SAFETY: as above; the rows hold whole blocks of 32.
        tile_of!(ts.len(), C => unsafe {
            bf16_simd::tile::<C>(ws, std::array::from_fn(|k| narrow(ts[k])))
        })
    });
    for r in tiled.end..range.end {
        for &t in &batched {
            out.set(t, r, float::dot_bf16(row(r), act(t), true));
        }
    }
}

/// The batched activation rows `batched` against the weight rows `tiled` (whole tiles of
/// [`float_simd::TILE_W`]), into `out`: `tile(r, ts)` gives the products of weight rows
/// `r..r + TILE_W` with activation rows `ts` (up to [`float_simd::TILE_X`]), `got[k][i]`
/// being row `ts[k]`'s with weight row `r + i`. The activation rows go in blocks of
/// [`FLOAT_ACT_BLOCK`], so that a block and the chunk's weights stay in the second-level
/// cache.
#[cfg(target_arch = "x86_64")]
fn tiled_products(
    batched: &[usize],
    tiled: Range<usize>,
    out: &Columns,
    mut tile: impl FnMut(usize, &[usize]) -> [[f32; float_simd::TILE_W]; float_simd::TILE_X],
) {
    for block in batched.chunks(FLOAT_ACT_BLOCK) {
        for r in tiled.clone().step_by(float_simd::TILE_W) {
            for ts in block.chunks(float_simd::TILE_X) {
                let got = tile(r, ts);
                for (&t, got) in ts.iter().zip(&got) {
                    for (i, &v) in got.iter().enumerate() {
                        out.set(t, r + i, v);
                    }
                }
            }
        }
    }
}

/// A float format's dot product of a weight row with an activation row (batched or not).
type FloatDot<W, X> = fn(&[W], &[X], bool) -> f32;
/// The same for four weight rows at once.
type FloatDot4<W, X> = fn([&[W]; 4], &[X], bool) -> [f32; 4];

/// Output features `range` of a float matrix `w` for every activation row of `x`: four
/// weight rows at a time against each activation row, the rest one by one (with AVX-512
/// or AVX2, [`float_rows_simd`]).
#[allow(clippy::too_many_arguments)]
fn float_rows<W: Copy + Into<f32> + WidenSimd, X: Copy + Into<f32> + WidenSimd>(
    w: &[W],
    x: &[X],
    cols: usize,
    range: Range<usize>,
    kernels: &[RowKernel],
    out: &Columns,
    dot: FloatDot<W, X>,
    dot4: FloatDot4<W, X>,
) {
    #[cfg(target_arch = "x86_64")]
    if let Some(isa) = float_simd::Isa::detected() {
        return float_rows_simd(isa, w, x, cols, range, kernels, out, dot);
    }
    let row = |r: usize| &w[r * cols..(r + 1) * cols];
    let fours = range.start + (range.len() / 4) * 4;
    for (t, &kernel) in kernels.iter().enumerate() {
        let x = &x[t * cols..(t + 1) * cols];
        for r in (range.start..fours).step_by(4) {
            let got = dot4(
                [row(r), row(r + 1), row(r + 2), row(r + 3)],
                x,
                kernel.batched(),
            );
            for (i, v) in got.into_iter().enumerate() {
                out.set(t, r + i, v);
            }
        }
        for r in fours..range.end {
            out.set(t, r, dot(row(r), x, kernel.batched()));
        }
    }
}

/// The weight and activation types [`float_rows`] takes: those the AVX-512 kernels widen.
#[cfg(target_arch = "x86_64")]
trait WidenSimd: float_simd::Widen {}
#[cfg(target_arch = "x86_64")]
impl<W: float_simd::Widen> WidenSimd for W {}
/// The weight and activation types [`float_rows`] takes.
#[cfg(not(target_arch = "x86_64"))]
trait WidenSimd {}
#[cfg(not(target_arch = "x86_64"))]
impl<W> WidenSimd for W {}

/// Activation rows per pass over a float chunk's weight rows (with the chunk's weights,
/// they stay in the second-level cache).
#[cfg(target_arch = "x86_64")]
const FLOAT_ACT_BLOCK: usize = 4 * float_simd::TILE_X;

/// Weight rows a lone activation row takes at a time. One: each thread then streams its
/// rows as one run of memory, as llama.cpp's `vec_dot` loop does. Four rows at once (four
/// streams a row apart) decoded a 1B F16 model about 10% slower in the server
/// (BENCHMARKS-history.md, issue 17's table).
#[cfg(target_arch = "x86_64")]
const LONE_ROWS: usize = 1;

/// [`float_rows`] with AVX-512 or AVX2 (`isa`): lone rows through the vector dot
/// product's kernel, batched rows in tiles of four weight rows by up to six activation rows (rows are a multiple of
/// four wherever matrices take our float kernels, see [`super::float::tinyblas_takes`]; any other
/// rows through the portable `dot`).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn float_rows_simd<W: float_simd::Widen, X: float_simd::Widen>(
    isa: float_simd::Isa,
    w: &[W],
    x: &[X],
    cols: usize,
    range: Range<usize>,
    kernels: &[RowKernel],
    out: &Columns,
    dot: FloatDot<W, X>,
) {
    use float_simd::TILE_W;
    assert!(range.start.is_multiple_of(TILE_W));
    let tiled = range.start..range.start + range.len() / TILE_W * TILE_W;
    let row = |r: usize| &w[r * cols..(r + 1) * cols];
    let act = |t: usize| &x[t * cols..(t + 1) * cols];
    let mut batched = Vec::with_capacity(kernels.len());
    for (t, kernel) in kernels.iter().enumerate() {
        if kernel.batched() {
            batched.push(t);
            continue;
        }
        for r in tiled.clone().step_by(LONE_ROWS) {
            // SAFETY: the caller checked that the CPU has `isa`.
            let got = unsafe {
                float_simd::lone::<W, X, LONE_ROWS>(
                    isa,
                    std::array::from_fn(|i| row(r + i)),
                    act(t),
                )
            };
            for (i, v) in got.into_iter().enumerate() {
                out.set(t, r + i, v);
            }
        }
        for r in tiled.end..range.end {
            out.set(t, r, dot(row(r), act(t), false));
        }
    }
    for r in tiled.end..range.end {
        for &t in &batched {
            out.set(t, r, dot(row(r), act(t), true));
        }
    }
    tiled_products(&batched, tiled, out, |r, ts| {
        let ws: [&[W]; TILE_W] = std::array::from_fn(|i| row(r + i));
        // SAFETY: as above.
        tile_of!(ts.len(), C => unsafe {
            float_simd::tile::<W, X, C>(isa, ws, std::array::from_fn(|k| act(ts[k])))
        })
    });
}
