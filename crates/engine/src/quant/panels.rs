//! F16 weights repacked in panels for products of many activation rows at once (a vision
//! tower's: thousands of patches through every matrix), and those products.
//!
//! A panel holds [`PanelMatrix::width`] consecutive output features (two of the CPU's
//! vectors: 16 with AVX2, 32 with AVX-512), input by input: the panel's values for input
//! `k` sit side by side, so one widening load gives a vector of outputs' weights, and a
//! kernel keeps two such vectors against up to [`GROUP`] activation rows, each row's input
//! broadcast: twelve accumulators, two weight vectors widened per twelve fused
//! multiply-adds (the row-by-row tiles of `float_simd` widen one per two to four).
//!
//! The arithmetic is not llama.cpp's tinyBLAS order (its sixteen-lane chains, which the
//! text models keep for their bit-parity): each output is one chain of fused multiply-adds
//! over the inputs in order, `acc = w[k] * x[k] + acc` from zero, with the activations
//! rounded to F16 first as ggml rounds them for F16 weights. The vector kernels
//! (`panels_simd.rs`) give the portable one's bits, whatever the blocking: the inputs go
//! in chunks of [`CHUNK_INPUTS`] with the accumulators stored between chunks, which an f32
//! store and load do not change.

use std::ops::Range;

use half::f16;

use super::output::Output;
use crate::error::EngineError;

#[cfg(target_arch = "x86_64")]
#[path = "panels_simd.rs"]
mod simd;

/// Most activation rows a kernel takes at once.
pub(super) const GROUP: usize = 6;
/// Activation rows per block: the block's inputs of one chunk (48 x 256 f32, 48 KiB) stay
/// in the second-level cache while a task's panels go past them.
const BLOCK_ROWS: usize = 8 * GROUP;
/// Inputs per chunk: a panel's chunk (16 x 256 f16 with AVX2, 8 KiB) stays in the
/// first-level cache while the block's groups go past it.
pub(super) const CHUNK_INPUTS: usize = 256;
/// Panels per task: each task reads every activation row once per block of its own
/// outputs, so tasks of four panels read the activations once per 64 outputs (AVX2).
const TASK_PANELS: usize = 4;

/// Which kernel a matrix's products take, chosen once when it is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernel {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Kernel {
    /// The best this CPU runs.
    fn for_cpu() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if crate::simd::avx512() {
                return Self::Avx512;
            }
            if crate::simd::avx2() {
                return Self::Avx2;
            }
        }
        Self::Portable
    }

    /// Outputs per panel: two vectors.
    fn width(self) -> usize {
        match self {
            Self::Portable => 16,
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => 16,
            #[cfg(target_arch = "x86_64")]
            Self::Avx512 => 32,
        }
    }
}

/// An F16 matrix (`rows` outputs of `cols` inputs) laid out in panels.
pub struct PanelMatrix {
    /// `[panel][input][output within the panel]`, zeros past the last output.
    values: Vec<f16>,
    rows: usize,
    cols: usize,
    kernel: Kernel,
}

/// One kernel call's work: a panel's chunk of inputs against a group of activation rows.
pub(super) struct Job<'a> {
    /// The panel's values of the chunk's inputs (`width` per input).
    pub(super) panel: &'a [f16],
    /// Each row's inputs of the chunk (rounded to F16), as many as the chunk's.
    pub(super) x: [&'a [f32]; GROUP],
    /// Rows of the group (`1..=GROUP`): the first `rows` of `x` and of `acc`.
    pub(super) rows: usize,
    /// Each row's accumulators of the panel's outputs (`width` per row), updated.
    pub(super) acc: &'a mut [f32],
}

impl PanelMatrix {
    /// The matrix of an F16 tensor's little-endian bytes, `rows` outputs of `cols` inputs
    /// each, row after row.
    pub fn new(bytes: &[u8], rows: usize, cols: usize) -> Result<Self, EngineError> {
        Self::with_kernel(bytes, rows, cols, Kernel::for_cpu())
    }

    fn with_kernel(
        bytes: &[u8],
        rows: usize,
        cols: usize,
        kernel: Kernel,
    ) -> Result<Self, EngineError> {
        if Some(bytes.len()) != rows.checked_mul(cols).and_then(|n| n.checked_mul(2)) {
            return Err(EngineError::InvalidModel(format!(
                "an F16 matrix of {rows}x{cols} has {} bytes",
                bytes.len()
            )));
        }
        let width = kernel.width();
        let panels = rows.div_ceil(width);
        let mut values = vec![f16::ZERO; panels * cols * width];
        for r in 0..rows {
            let (p, lane) = (r / width, r % width);
            let row = &bytes[r * cols * 2..(r + 1) * cols * 2];
            for (k, v) in row.chunks_exact(2).enumerate() {
                values[(p * cols + k) * width + lane] = f16::from_le_bytes([v[0], v[1]]);
            }
        }
        Ok(Self {
            values,
            rows,
            cols,
            kernel,
        })
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Outputs per panel.
    fn width(&self) -> usize {
        self.kernel.width()
    }

    /// `x W^T` for the `n` rows of `x` (`n x cols`): `n x rows`, on the compute threads.
    pub fn matmul(&self, x: &[f32]) -> Vec<f32> {
        assert!(self.cols > 0 && x.len().is_multiple_of(self.cols));
        let n = x.len() / self.cols;
        let rounded: Vec<f32> = x.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
        let mut y = vec![0f32; n * self.rows];
        let panels = self.rows.div_ceil(self.width());
        let tasks = panels.div_ceil(TASK_PANELS);
        let output = Output::new(&mut y, n, self.rows);
        crate::threads::for_each_index(tasks, |task| {
            let first = task * TASK_PANELS;
            let mine = first..(first + TASK_PANELS).min(panels);
            self.task(&rounded, n, mine, &output);
        });
        y
    }

    /// Outputs of panels `mine` for every activation row, into `output`.
    fn task(&self, x: &[f32], n: usize, mine: Range<usize>, output: &Output) {
        let (width, cols) = (self.width(), self.cols);
        let outputs = mine.start * width..(mine.end * width).min(self.rows);
        // SAFETY: each task's panels, and so its columns, are its own.
        let columns = unsafe { output.columns(outputs.clone()) };
        let task_width = mine.len() * width;
        // The block's accumulators: `[panel][row][output within the panel]`.
        let mut acc = vec![0f32; mine.len() * BLOCK_ROWS * width];
        // One activation row's outputs of the task, gathered from its panels.
        let mut line = vec![0f32; task_width];
        for block in (0..n).step_by(BLOCK_ROWS) {
            let rows = BLOCK_ROWS.min(n - block);
            acc.fill(0.0);
            for k0 in (0..cols).step_by(CHUNK_INPUTS) {
                let k1 = (k0 + CHUNK_INPUTS).min(cols);
                for (i, p) in mine.clone().enumerate() {
                    let panel = &self.values[(p * cols + k0) * width..(p * cols + k1) * width];
                    let panel_acc = &mut acc[i * BLOCK_ROWS * width..(i + 1) * BLOCK_ROWS * width];
                    for (g, acc) in panel_acc[..rows * width]
                        .chunks_mut(GROUP * width)
                        .enumerate()
                    {
                        let first = block + g * GROUP;
                        let group = acc.len() / width;
                        let x = std::array::from_fn(|j| {
                            let t = first + j.min(group - 1);
                            &x[t * cols + k0..t * cols + k1]
                        });
                        self.run(Job {
                            panel,
                            x,
                            rows: group,
                            acc,
                        });
                    }
                }
            }
            for r in 0..rows {
                for (i, piece) in line.chunks_exact_mut(width).enumerate() {
                    piece.copy_from_slice(&acc[(i * BLOCK_ROWS + r) * width..][..width]);
                }
                columns.set_run(block + r, outputs.start, &line);
            }
        }
    }

    /// One kernel call, with the kernel chosen at load.
    fn run(&self, job: Job<'_>) {
        match self.kernel {
            Kernel::Portable => portable(job, self.width()),
            // SAFETY: chosen by `Kernel::for_cpu` only where the CPU has AVX2, FMA and
            // F16C; the job's slices are as `Job` describes them.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { simd::avx2(job) },
            // SAFETY: as above, where the CPU has AVX-512F besides.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => unsafe { simd::avx512(job) },
        }
    }
}

/// The kernel in portable code: the order of operations every version follows.
fn portable(job: Job<'_>, width: usize) {
    for (x, acc) in job
        .x
        .iter()
        .zip(job.acc.chunks_exact_mut(width))
        .take(job.rows)
    {
        for (k, &xk) in x.iter().enumerate() {
            let w = &job.panel[k * width..(k + 1) * width];
            for (a, w) in acc.iter_mut().zip(w) {
                *a = w.to_f32().mul_add(xk, *a);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A few thousand values of both signs and several magnitudes, reproducibly.
    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).max(1);
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                let unit = (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
                unit * [1.0, 8.0, 0.05][i % 3]
            })
            .collect()
    }

    fn f16_bytes(v: &[f32]) -> Vec<u8> {
        v.iter()
            .flat_map(|&x| f16::from_f32(x).to_le_bytes())
            .collect()
    }

    /// Shapes past every edge: outputs that leave a panel part empty, inputs past the last
    /// whole chunk, activation rows past the last whole group and block.
    const SHAPES: [(usize, usize, usize); 4] =
        [(37, 300, 13), (16, 256, 6), (70, 520, 55), (5, 3, 1)];

    #[test]
    fn the_vector_kernels_give_the_portable_bits() {
        let kernels = {
            let mut k = Vec::new();
            #[cfg(target_arch = "x86_64")]
            {
                let cpu = crate::simd::cpu::detected();
                if !crate::simd::cpu::lacks(cpu.avx2, "AVX2") {
                    k.push(Kernel::Avx2);
                }
                if !crate::simd::cpu::lacks(cpu.avx512, "AVX-512") {
                    k.push(Kernel::Avx512);
                }
            }
            k
        };
        for (rows, cols, n) in SHAPES {
            let w = f16_bytes(&values(rows * cols, 1));
            let x = values(n * cols, 2);
            let want = PanelMatrix::with_kernel(&w, rows, cols, Kernel::Portable)
                .unwrap()
                .matmul(&x);
            for &kernel in &kernels {
                let got = PanelMatrix::with_kernel(&w, rows, cols, kernel)
                    .unwrap()
                    .matmul(&x);
                for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{kernel:?} {rows}x{cols} by {n}: {i}"
                    );
                }
            }
        }
    }

    /// Each output is the sum of the products of its weights with the row's inputs
    /// rounded to F16, within f32 rounding of the exact sum.
    #[test]
    fn products_are_the_f16_rounded_sums() {
        for (rows, cols, n) in SHAPES {
            let (w, x) = (values(rows * cols, 3), values(n * cols, 4));
            let got = PanelMatrix::new(&f16_bytes(&w), rows, cols)
                .unwrap()
                .matmul(&x);
            for t in 0..n {
                for r in 0..rows {
                    let (mut sum, mut size) = (0f64, 0f64);
                    for k in 0..cols {
                        let a = f16::from_f32(w[r * cols + k]).to_f64();
                        let b = f16::from_f32(x[t * cols + k]).to_f64();
                        sum += a * b;
                        size += (a * b).abs();
                    }
                    let g = got[t * rows + r] as f64;
                    assert!(
                        (g - sum).abs() <= 1e-6 * size + 1e-30,
                        "{rows}x{cols} by {n}: [{t}][{r}] {g} vs {sum}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_wrong_size_is_refused() {
        assert!(PanelMatrix::new(&[0u8; 10], 2, 3).is_err());
    }
}
