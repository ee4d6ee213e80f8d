//! The vision transformer the projectors share, in llama.cpp's `clip` two kinds
//! ([`TowerKind`]): SigLIP's (Gemma 3, Idefics3) and Qwen2.5-VL's. Patches are embedded by
//! a strided convolution and go through pre-norm blocks of bidirectional attention and a
//! feed-forward, then an optional last norm. SigLIP's are square images, learned
//! positions added to the patches, layer norms and GELU; Qwen2.5-VL's are images of any
//! size, positions as 2-D rotations of queries and keys, RMS norms, a SiLU-gated
//! feed-forward and most blocks attending within windows of the image. A projector file
//! holds only what it does before (preprocessing, the patches' order) and after (pooling,
//! merging, projection) the tower, as an architecture file over the shared decoder.
//!
//! Arithmetic follows ggml's CPU backend where it rounds: the convolution's pixels and
//! kernel are rounded to f16 (ggml's `im2col` is f16), a matrix of f16 weights takes
//! activations rounded to f16, attention's keys and values are f16 (llama.cpp runs the
//! tower with flash attention), GELU is ggml's f16 table. Sums are in ggml's orders where
//! they are cheap to follow and in plain order otherwise: the tower's outputs agree with
//! llama.cpp's to a few ulps, not bit for bit.

use std::ops::Range;

use half::f16;

use super::attention::{self, HeadsKv};
use super::layers::{FeedForward, Linear, Norm};
use crate::error::EngineError;
use crate::gguf::GgufFile;
use crate::model::ops::{self, Rope};
use crate::quant::{OwnFormat, QMatrix, RowKernel};

/// A tower's hyper-parameters (`clip.vision.*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TowerShape {
    /// Side of the square image it reads, in pixels (SigLIP's; Qwen2.5-VL's reads any
    /// size).
    pub image_size: usize,
    /// Side of a patch, in pixels.
    pub patch_size: usize,
    /// Width of its embeddings.
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
}

impl TowerShape {
    /// Patches on a side of the square image.
    pub fn grid(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// Patches per square image.
    pub fn patches(&self) -> usize {
        self.grid() * self.grid()
    }
}

/// The two towers of llama.cpp's projectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TowerKind {
    /// SigLIP: one patch kernel with a bias, learned positions, layer norms, GELU.
    Siglip,
    /// Qwen2.5-VL's: two patch kernels summed (a video frame's two times, the same still
    /// image), 2-D rotary positions, RMS norms, SiLU-gated feed-forwards with biases,
    /// blocks attending within windows but every `clip.vision.n_wa_pattern`-th.
    Windowed,
}

/// Where the tower's rows come from and how they attend: a run's own (an image of any
/// size, its patches in a projector's order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchLayout {
    /// Patches across the image.
    pub columns: usize,
    /// Patches down the image.
    pub rows: usize,
    /// The patch (`row * columns + column`) each of the tower's rows holds.
    pub order: Vec<usize>,
    /// The tower's rows in windows, in order, each attending within itself in the blocks
    /// that attend within windows; empty: every block attends to the whole image.
    pub windows: Vec<Range<usize>>,
}

impl PatchLayout {
    /// Every patch of a `columns` x `rows` grid in raster order, no windows.
    pub fn raster(columns: usize, rows: usize) -> Self {
        Self {
            columns,
            rows,
            order: (0..columns * rows).collect(),
            windows: Vec::new(),
        }
    }

    /// The patch row and column of the tower's row `row`.
    pub fn place(&self, row: usize) -> (usize, usize) {
        let patch = self.order[row];
        (patch / self.columns, patch % self.columns)
    }
}

/// How the tower tells patches apart.
enum Positions {
    /// One learned row per patch of the square grid, added to its embedding.
    Learned(Vec<f32>),
    /// Queries and keys turned by the patch's row and column.
    Rotary(Rope),
}

/// One pre-norm transformer block.
struct Block {
    ln1: Norm,
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    ln2: Norm,
    ffn: FeedForward,
    /// Whether it attends within the layout's windows.
    windowed: bool,
}

/// The vision tower.
pub struct Tower {
    shape: TowerShape,
    /// The patch convolution's kernels (their results summed), one row of
    /// `3 * patch * patch` values (channel, then row, then column) per output, in f16 as
    /// ggml multiplies them.
    patch_kernels: Vec<QMatrix>,
    patch_bias: Option<Vec<f32>>,
    positions: Positions,
    blocks: Vec<Block>,
    post_ln: Option<Norm>,
}

impl Tower {
    /// Reads the tower of an `mmproj` file, of the kind its projector sits on.
    pub fn load(g: &mut GgufFile, kind: TowerKind) -> Result<Self, EngineError> {
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
        let head_dim = d.checked_div(shape.heads).unwrap_or(0);
        let heads_fit = shape.heads > 0 && d % shape.heads == 0 && head_dim % 4 == 0;
        if !sane || p == 0 || shape.image_size < p || !heads_fit {
            return Err(EngineError::InvalidModel(format!(
                "vision tower of {}-pixel images in {p}-pixel patches, {d} wide in {} heads, \
                 {layers} blocks",
                shape.image_size, shape.heads
            )));
        }
        let windowed = kind == TowerKind::Windowed;
        let (ffn_key, ffn_name) = match kind {
            TowerKind::Siglip => ("clip.use_gelu", "GELU"),
            TowerKind::Windowed => ("clip.use_silu", "SiLU-gated"),
        };
        if !g.meta.bool(ffn_key).unwrap_or(false) {
            return Err(EngineError::Unsupported(format!(
                "a vision tower whose feed-forward is not {ffn_name} (`{ffn_key}`)"
            )));
        }
        let kernel_names: &[&str] = match kind {
            TowerKind::Siglip => &["v.patch_embd.weight"],
            TowerKind::Windowed => &["v.patch_embd.weight", "v.patch_embd.weight.1"],
        };
        let mut patch_kernels = Vec::new();
        let (size, padded) = (3 * p * p, patch_width(p));
        for name in kernel_names {
            g.expect_dims(name, &[d, 3, p, p])?;
            let values = g.vector(name)?;
            let mut bytes = Vec::with_capacity(d * padded * 2);
            for row in values.chunks_exact(size) {
                bytes.extend(row.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()));
                bytes.resize(bytes.len() + (padded - size) * 2, 0);
            }
            patch_kernels.push(QMatrix::from_blocks(OwnFormat::F16, bytes, d, padded)?);
        }
        let (patch_bias, positions) = match kind {
            TowerKind::Siglip => {
                g.expect_dims("v.position_embd.weight", &[shape.patches(), d])?;
                (
                    Some(g.vector_of("v.patch_embd.bias", d)?),
                    Positions::Learned(g.vector("v.position_embd.weight")?),
                )
            }
            TowerKind::Windowed => (None, Positions::Rotary(Rope::vision(head_dim, 10000.0))),
        };
        // Qwen2.5-VL's blocks attend within windows but every n-th (none: all whole).
        let window_period = match kind {
            TowerKind::Siglip => 0,
            TowerKind::Windowed => g.meta.u32(&key("n_wa_pattern"))? as usize,
        };
        let mut blocks = Vec::with_capacity(layers);
        for i in 0..layers {
            let n = |s: &str| format!("v.blk.{i}.{s}");
            blocks.push(Block {
                ln1: Norm::load(g, &n("ln1"), d, eps, windowed)?,
                q: Linear::load(g, &n("attn_q"))?,
                k: Linear::load(g, &n("attn_k"))?,
                v: Linear::load(g, &n("attn_v"))?,
                out: Linear::load(g, &n("attn_out"))?,
                ln2: Norm::load(g, &n("ln2"), d, eps, windowed)?,
                ffn: FeedForward::load(g, &n(""), windowed)?,
                windowed: window_period > 0 && (i + 1) % window_period != 0,
            });
        }
        for block in &blocks {
            let square = [&block.q, &block.k, &block.v, &block.out]
                .iter()
                .all(|l| l.inputs() == d && l.outputs() == d);
            if !square {
                return Err(EngineError::InvalidModel(format!(
                    "vision attention projections are not {d} x {d}"
                )));
            }
        }
        let post_ln = match g.has_tensor("v.post_ln.weight") {
            true => Some(Norm::load(g, "v.post_ln", d, eps, windowed)?),
            false => None,
        };
        Ok(Self {
            shape,
            patch_kernels,
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
    /// (all of red, then green, then blue, each row by row), `layout.columns` by
    /// `layout.rows` patches. [`Self::advance`] runs it; its output is one row of
    /// `hidden` values per entry of `layout.order`.
    pub fn start(&self, pixels: Vec<f32>, layout: PatchLayout) -> TowerRun {
        TowerRun {
            pixels,
            layout,
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

    /// Runs the next `rows` rows' share of the tower's work (one phase of one block at
    /// most), so that an image's encoding can be cut into pieces of bounded time between
    /// other work. Says whether the tower is done ([`TowerRun::output`]).
    pub fn advance(&self, run: &mut TowerRun, rows: usize) -> Result<bool, EngineError> {
        let (n, d) = (run.layout.order.len(), self.shape.hidden);
        let r = run.row..n.min(run.row.saturating_add(rows.max(1)));
        let count = r.len();
        let span = r.start * d..r.end * d;
        match run.phase {
            Phase::Embed => {
                if run.row == 0 {
                    run.x = vec![0f32; n * d];
                }
                self.embed_patches(run, r.clone())?;
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
                let (mut q, mut k) = (block.q.apply(&h, count)?, block.k.apply(&h, count)?);
                if let Positions::Rotary(rope) = &self.positions {
                    for (i, (q, k)) in q.chunks_exact_mut(d).zip(k.chunks_exact_mut(d)).enumerate()
                    {
                        let (y, x) = run.layout.place(r.start + i);
                        rope.apply_at(q, [y, x, y, x]);
                        rope.apply_at(k, [y, x, y, x]);
                    }
                }
                run.q[span.clone()].copy_from_slice(&q);
                run.k[span.clone()].copy_from_slice(&k);
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
                let whole = 0..n;
                let windows = match self.blocks[run.block].windowed {
                    true if !run.layout.windows.is_empty() => run.layout.windows.as_slice(),
                    _ => std::slice::from_ref(&whole),
                };
                for keys in windows {
                    let (lo, hi) = (keys.start.max(r.start), keys.end.min(r.end));
                    if lo < hi {
                        let rows = lo * d..hi * d;
                        let (q, out) = (&run.q[rows.clone()], &mut run.attended[rows]);
                        attention::attend(q, kv, keys.clone(), scale, out);
                    }
                }
            }
            Phase::Feed => {
                run.kv = None;
                let block = &self.blocks[run.block];
                let x = &mut run.x[span.clone()];
                ops::add_assign(x, &block.out.apply(&run.attended[span], count)?);
                let mut h = x.to_vec();
                block.ln2.apply(&mut h);
                ops::add_assign(x, &block.ffn.apply(&h, count)?);
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

    /// The strided convolution of the patches of `run`'s rows `rows` into those rows:
    /// each patch's pixels (rounded to f16; channel, row, column) against each kernel
    /// row, as ggml's `im2col` and matrix product compute it, one kernel's result added to
    /// the other's, then the bias and the learned position.
    fn embed_patches(&self, run: &mut TowerRun, rows: Range<usize>) -> Result<(), EngineError> {
        let (p, d) = (self.shape.patch_size, self.shape.hidden);
        let layout = &run.layout;
        let width = layout.columns * p;
        let plane = width * layout.rows * p;
        let padded = patch_width(p);
        let mut columns = Vec::with_capacity(rows.len() * padded);
        for row in rows.clone() {
            let (py, px) = layout.place(row);
            for c in 0..3 {
                for ky in 0..p {
                    let at = c * plane + (py * p + ky) * width + px * p;
                    columns.extend(
                        run.pixels[at..at + p]
                            .iter()
                            .map(|&v| f16::from_f32(v).to_f32()),
                    );
                }
            }
            columns.resize(columns.len() + padded - 3 * p * p, 0.0);
        }
        let kernels = vec![RowKernel::GemvInWideBatch; rows.len()];
        let mut sum = self.patch_kernels[0].matmul(&columns, &kernels)?;
        for kernel in &self.patch_kernels[1..] {
            ops::add_assign(&mut sum, &kernel.matmul(&columns, &kernels)?);
        }
        for (i, row) in sum.chunks_exact_mut(d).enumerate() {
            if let Some(bias) = &self.patch_bias {
                ops::add_assign(row, bias);
            }
            if let Positions::Learned(table) = &self.positions {
                let patch = layout.order[rows.start + i];
                ops::add_assign(row, &table[patch * d..][..d]);
            }
        }
        run.x[rows.start * d..rows.end * d].copy_from_slice(&sum);
        Ok(())
    }
}

/// A patch's `3 * patch * patch` values padded with zeros to whole vectors of sixteen
/// (the F16 matrix rows' unit): a zero adds nothing to a dot product.
fn patch_width(patch: usize) -> usize {
    (3 * patch * patch).next_multiple_of(16)
}

/// Which part of a block an image's run is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Patches embedded, learned positions added.
    Embed,
    /// The first norm and the query, key and value projections (and their rotations).
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
    layout: PatchLayout,
    /// The residual stream, one row per entry of the layout's order.
    x: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// The block's keys and values laid out for attention.
    kv: Option<HeadsKv>,
    attended: Vec<f32>,
    block: usize,
    phase: Phase,
    /// The next row of the phase.
    row: usize,
}

impl TowerRun {
    /// The tower's output, once [`Tower::advance`] said it is done.
    pub fn output(&self) -> Option<&[f32]> {
        (self.phase == Phase::Done).then_some(self.x.as_slice())
    }

    /// The patches its rows hold.
    pub fn layout(&self) -> &PatchLayout {
        &self.layout
    }
}
