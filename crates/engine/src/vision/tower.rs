//! The vision transformer every projector shares (SigLIP's, as llama.cpp's `clip` builds
//! it): patches embedded by a strided convolution, learned positions added, pre-norm
//! blocks of bidirectional attention and a GELU feed-forward, a last layer norm. A
//! projector file holds only what it does before (preprocessing) and after (pooling,
//! projection) the tower, as an architecture file over the shared decoder.
//!
//! Arithmetic follows ggml's CPU backend where it rounds: the convolution's pixels and
//! kernel are rounded to f16 (ggml's `im2col` is f16), a matrix of f16 weights takes
//! activations rounded to f16, attention's keys and values are f16 (llama.cpp runs the
//! tower with flash attention), GELU is ggml's f16 table. Sums are in ggml's orders where
//! they are cheap to follow and in plain order otherwise: the tower's outputs agree with
//! llama.cpp's to a few ulps, not bit for bit.

use half::f16;

use super::attention::{self, HeadsKv};
use crate::error::EngineError;
use crate::gguf::GgufFile;
use crate::model::ops;
use crate::quant::{QMatrix, RowKernel};
use crate::threads;

/// A tower's hyper-parameters (`clip.vision.*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TowerShape {
    /// Side of the square image it reads, in pixels.
    pub image_size: usize,
    /// Side of a patch, in pixels.
    pub patch_size: usize,
    /// Width of its embeddings.
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
}

impl TowerShape {
    /// Patches on a side of the image.
    pub fn grid(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// Patches per image.
    pub fn patches(&self) -> usize {
        self.grid() * self.grid()
    }
}

/// A linear layer: a weight matrix and a bias.
struct Linear {
    weight: QMatrix,
    bias: Vec<f32>,
}

impl Linear {
    fn load(g: &mut GgufFile, name: &str) -> Result<Self, EngineError> {
        let weight = g.matmul(&format!("{name}.weight"))?;
        let bias = g.vector_of(&format!("{name}.bias"), weight.rows())?;
        Ok(Self { weight, bias })
    }

    /// `x W^T + b` for every row of `x` (a batch: ggml's batched products).
    fn apply(&self, x: &[f32], rows: usize) -> Result<Vec<f32>, EngineError> {
        let kernels = vec![RowKernel::GemvInWideBatch; rows];
        let mut y = self.weight.matmul(x, &kernels)?;
        for row in y.chunks_exact_mut(self.bias.len()) {
            ops::add_assign(row, &self.bias);
        }
        Ok(y)
    }
}

/// Layer normalisation with a weight and a bias.
pub(super) struct LayerNorm {
    weight: Vec<f32>,
    bias: Vec<f32>,
    eps: f32,
}

impl LayerNorm {
    fn load(g: &mut GgufFile, name: &str, width: usize, eps: f32) -> Result<Self, EngineError> {
        Ok(Self {
            weight: g.vector_of(&format!("{name}.weight"), width)?,
            bias: g.vector_of(&format!("{name}.bias"), width)?,
            eps,
        })
    }

    /// Normalises every row of `x` in place.
    fn apply(&self, x: &mut [f32]) {
        for row in x.chunks_exact_mut(self.weight.len()) {
            layer_norm(row, self.eps);
            for ((v, w), b) in row.iter_mut().zip(&self.weight).zip(&self.bias) {
                *v = *v * w + b;
            }
        }
    }
}

/// ggml's `norm` of one row (its AVX2 order): the mean summed in f64 and rounded to f32,
/// the squared deviations summed eight at a time (each eight reduced in f32 as its lanes
/// pair up) into an f64, then the row scaled by `1/sqrt(variance + eps)`.
fn layer_norm(row: &mut [f32], eps: f32) {
    let n = row.len();
    let mean = (row.iter().map(|&v| f64::from(v)).sum::<f64>() as f32) / n as f32;
    let mut sum = 0f64;
    let whole = n / 8 * 8;
    for chunk in row[..whole].chunks_exact_mut(8) {
        let mut sq = [0f32; 8];
        for (s, v) in sq.iter_mut().zip(chunk.iter_mut()) {
            *v -= mean;
            *s = *v * *v;
        }
        let half: [f32; 4] = std::array::from_fn(|l| sq[l + 4] + sq[l]);
        let (a, b) = (half[0] + half[2], half[1] + half[3]);
        sum += f64::from(a + b);
    }
    for v in &mut row[whole..] {
        *v -= mean;
        sum += f64::from(*v * *v);
    }
    let variance = (sum / n as f64) as f32;
    let scale = 1.0 / (variance + eps).sqrt();
    row.iter_mut().for_each(|v| *v *= scale);
}

/// One pre-norm transformer block.
struct Block {
    ln1: LayerNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    ln2: LayerNorm,
    up: Linear,
    down: Linear,
}

/// The vision tower.
pub struct Tower {
    shape: TowerShape,
    /// The patch convolution's kernel, one row of `3 * patch * patch` values (channel,
    /// then row, then column) per output, rounded to f16 as ggml multiplies it.
    patch_kernel: Vec<f16>,
    patch_bias: Vec<f32>,
    /// One row per patch, raster order.
    positions: Vec<f32>,
    blocks: Vec<Block>,
    post_ln: Option<LayerNorm>,
}

impl Tower {
    /// Reads the tower of an `mmproj` file.
    pub fn load(g: &mut GgufFile) -> Result<Self, EngineError> {
        let key = |k: &str| format!("clip.vision.{k}");
        let shape = TowerShape {
            image_size: g.meta.u32(&key("image_size"))? as usize,
            patch_size: g.meta.u32(&key("patch_size"))? as usize,
            hidden: g.meta.u32(&key("embedding_length"))? as usize,
            heads: g.meta.u32(&key("attention.head_count"))? as usize,
        };
        let eps = g.meta.f32(&key("attention.layer_norm_epsilon"))?;
        let layers = g.meta.u32(&key("block_count"))? as usize;
        let (p, d) = (shape.patch_size, shape.hidden);
        // llama.cpp's own bounds (an image at most 8192 pixels a side), and a file's sizes
        // kept where memory arithmetic cannot overflow.
        let sane = shape.image_size <= 8192 && d <= 1 << 16 && layers <= 1024 && p <= 1024;
        if !sane || p == 0 || shape.image_size < p || shape.heads == 0 || d % shape.heads != 0 {
            return Err(EngineError::InvalidModel(format!(
                "vision tower of {}-pixel images in {p}-pixel patches, {d} wide in {} heads, \
                 {layers} blocks",
                shape.image_size, shape.heads
            )));
        }
        if !g.meta.bool("clip.use_gelu").unwrap_or(false) {
            return Err(EngineError::Unsupported(
                "a vision tower whose feed-forward is not GELU (`clip.use_gelu`)".into(),
            ));
        }
        g.expect_dims("v.patch_embd.weight", &[d, 3, p, p])?;
        let patch_kernel = g
            .vector("v.patch_embd.weight")?
            .into_iter()
            .map(f16::from_f32)
            .collect();
        let patch_bias = g.vector_of("v.patch_embd.bias", d)?;
        g.expect_dims("v.position_embd.weight", &[shape.patches(), d])?;
        let positions = g.vector("v.position_embd.weight")?;
        let mut blocks = Vec::with_capacity(layers);
        for i in 0..layers {
            let n = |s: &str| format!("v.blk.{i}.{s}");
            blocks.push(Block {
                ln1: LayerNorm::load(g, &n("ln1"), d, eps)?,
                q: Linear::load(g, &n("attn_q"))?,
                k: Linear::load(g, &n("attn_k"))?,
                v: Linear::load(g, &n("attn_v"))?,
                out: Linear::load(g, &n("attn_out"))?,
                ln2: LayerNorm::load(g, &n("ln2"), d, eps)?,
                up: Linear::load(g, &n("ffn_up"))?,
                down: Linear::load(g, &n("ffn_down"))?,
            });
        }
        let post_ln = if g.has_tensor("v.post_ln.weight") {
            Some(LayerNorm::load(g, "v.post_ln", d, eps)?)
        } else {
            None
        };
        Ok(Self {
            shape,
            patch_kernel,
            patch_bias,
            positions,
            blocks,
            post_ln,
        })
    }

    /// The tower's hyper-parameters.
    pub fn shape(&self) -> &TowerShape {
        &self.shape
    }

    /// An image's way through the tower, not yet started: its normalised pixels, planar
    /// (all of red, then green, then blue, each row by row) and `image_size` on a side.
    /// [`Self::advance`] runs it; its output is one row of `hidden` values per patch, raster
    /// order.
    pub fn start(&self, pixels: Vec<f32>) -> TowerRun {
        TowerRun {
            pixels,
            x: Vec::new(),
            q: Vec::new(),
            k: Vec::new(),
            v: Vec::new(),
            kv: None,
            attended: Vec::new(),
            block: 0,
            phase: Phase::Embed,
            row: 0,
        }
    }

    /// Runs the next `rows` patches' share of the tower's work (one phase of one block
    /// at most), so that an image's encoding can be cut into pieces of bounded time
    /// between other work. Says whether the tower is done ([`TowerRun::output`]).
    pub fn advance(&self, run: &mut TowerRun, rows: usize) -> Result<bool, EngineError> {
        let (n, d) = (self.shape.patches(), self.shape.hidden);
        let r = run.row..n.min(run.row.saturating_add(rows.max(1)));
        let count = r.len();
        let span = r.start * d..r.end * d;
        match run.phase {
            Phase::Embed => {
                if run.row == 0 {
                    run.x = vec![0f32; n * d];
                }
                self.embed_patches(&run.pixels, r.clone(), &mut run.x[span.clone()]);
                ops::add_assign(&mut run.x[span.clone()], &self.positions[span]);
            }
            Phase::Project => {
                if run.row == 0 {
                    run.q = vec![0f32; n * d];
                    run.k = vec![0f32; n * d];
                    run.v = vec![0f32; n * d];
                }
                let block = &self.blocks[run.block];
                let mut h = run.x[span.clone()].to_vec();
                block.ln1.apply(&mut h);
                run.q[span.clone()].copy_from_slice(&block.q.apply(&h, count)?);
                run.k[span.clone()].copy_from_slice(&block.k.apply(&h, count)?);
                run.v[span].copy_from_slice(&block.v.apply(&h, count)?);
            }
            Phase::Attend => {
                if run.row == 0 {
                    // Keys and values as flash attention holds them: f16, head by head.
                    let heads = self.shape.heads;
                    run.kv = Some(HeadsKv::new(&run.k, &run.v, heads, d / heads));
                    run.k = Vec::new();
                    run.v = Vec::new();
                    run.attended = vec![0f32; n * d];
                }
                let kv = run.kv.as_ref().expect("laid out at the phase's first row");
                let scale = 1.0 / ((d / self.shape.heads) as f32).sqrt();
                attention::attend(&run.q[span.clone()], kv, scale, &mut run.attended[span]);
            }
            Phase::Feed => {
                run.kv = None;
                let block = &self.blocks[run.block];
                let x = &mut run.x[span.clone()];
                ops::add_assign(x, &block.out.apply(&run.attended[span], count)?);
                let mut h = x.to_vec();
                block.ln2.apply(&mut h);
                let mut up = block.up.apply(&h, count)?;
                ops::gelu_in_place(&mut up);
                ops::add_assign(x, &block.down.apply(&up, count)?);
            }
            Phase::Done => return Ok(true),
        }
        run.row = r.end;
        if run.row == n {
            run.row = 0;
            run.phase = match run.phase {
                Phase::Embed if self.blocks.is_empty() => Phase::Done,
                Phase::Embed => Phase::Project,
                Phase::Project => Phase::Attend,
                Phase::Attend => Phase::Feed,
                Phase::Feed if run.block + 1 < self.blocks.len() => {
                    run.block += 1;
                    Phase::Project
                }
                Phase::Feed | Phase::Done => Phase::Done,
            };
            if run.phase == Phase::Done {
                if let Some(ln) = &self.post_ln {
                    ln.apply(&mut run.x);
                }
                run.q = Vec::new();
                run.k = Vec::new();
                run.v = Vec::new();
                run.attended = Vec::new();
                run.pixels = Vec::new();
            }
        }
        Ok(run.phase == Phase::Done)
    }

    /// The strided convolution of patches `patches` into `out` (their rows): each
    /// patch's pixels (rounded to f16; channel, row, column) against each kernel row,
    /// summed in f32, plus the bias.
    fn embed_patches(&self, pixels: &[f32], patches: std::ops::Range<usize>, out: &mut [f32]) {
        let (s, p, d, g) = (
            self.shape.image_size,
            self.shape.patch_size,
            self.shape.hidden,
            self.shape.grid(),
        );
        let width = 3 * p * p;
        threads::for_each_rows(out, d, |i, row| {
            let patch = patches.start + i;
            let (py, px) = (patch / g, patch % g);
            let mut column = Vec::with_capacity(width);
            for c in 0..3 {
                for ky in 0..p {
                    let at = c * s * s + (py * p + ky) * s + px * p;
                    column.extend(
                        pixels[at..at + p]
                            .iter()
                            .map(|&v| f16::from_f32(v).to_f32()),
                    );
                }
            }
            for (o, (out, kernel)) in row
                .iter_mut()
                .zip(self.patch_kernel.chunks_exact(width))
                .enumerate()
            {
                let dot: f32 = kernel
                    .iter()
                    .zip(&column)
                    .fold(0.0, |acc, (w, x)| w.to_f32().mul_add(*x, acc));
                *out = dot + self.patch_bias[o];
            }
        });
    }
}

/// Which part of a block an image's run is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Patches embedded, positions added.
    Embed,
    /// The first norm and the query, key and value projections.
    Project,
    /// Attention.
    Attend,
    /// The output projection, the second norm and the feed-forward, both residuals.
    Feed,
    /// The last norm applied: the output is ready.
    Done,
}

/// One image's state between pieces of the tower's work ([`Tower::advance`]).
pub struct TowerRun {
    pixels: Vec<f32>,
    /// The residual stream, one row per patch.
    x: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// The block's keys and values laid out for attention.
    kv: Option<HeadsKv>,
    attended: Vec<f32>,
    block: usize,
    phase: Phase,
    /// The next patch of the phase.
    row: usize,
}

impl TowerRun {
    /// The tower's output, once [`Tower::advance`] said it is done.
    pub fn output(&self) -> Option<&[f32]> {
        (self.phase == Phase::Done).then_some(self.x.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's norm on rows whose width is and is not a multiple of eight: zero mean, unit
    /// variance, to f32 accuracy.
    #[test]
    fn layer_norm_centres_and_scales() {
        for n in [8, 13, 64] {
            let mut row: Vec<f32> = (0..n).map(|i| (i as f32 * 0.7).sin() * 3.0 + 1.5).collect();
            layer_norm(&mut row, 1e-6);
            let mean: f32 = row.iter().sum::<f32>() / n as f32;
            let var: f32 = row.iter().map(|v| v * v).sum::<f32>() / n as f32;
            assert!(mean.abs() < 1e-6, "{n}: mean {mean}");
            assert!((var - 1.0).abs() < 1e-4, "{n}: variance {var}");
        }
    }
}
