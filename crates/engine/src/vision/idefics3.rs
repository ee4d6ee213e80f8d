//! Idefics3's projector (`clip.projector_type = idefics3`: SmolVLM, SmolVLM2, Idefics3):
//! the image cut into tiles of the tower's size plus one global view of it, each tile's
//! patch grid folded `scale x scale` into the channels ("pixel shuffle") and projected
//! into the text model's width by one matrix without bias. SmolVLM's 512-pixel tiles in
//! 16-pixel patches at scale 4 give 8x8 = 64 tokens a tile.
//!
//! Preprocessing follows `mtmd`'s: the image scaled (Lanczos) so that its longer side is
//! `clip.vision.preproc_image_size`, the other side rounded down then up to even, scaled
//! again (Lanczos) to whole tiles, then cut row by row; the global view is that refined
//! image scaled (Lanczos) to one tile. In the prompt the tiles come first, each after
//! `<fake_token_around_image><row_R_col_C>`, rows ended by a newline, then the global
//! view between `\n\n<fake_token_around_image><global-img>` and
//! `<fake_token_around_image>`.

use super::image::RgbImage;
use super::resize::{crop, resize, Filter};
use super::tower::TowerShape;
use super::ImagePart;
use crate::error::EngineError;
use crate::gguf::GgufFile;
use crate::quant::{QMatrix, RowKernel};

/// The projector's weights and preprocessing.
pub(super) struct Idefics3 {
    projection: QMatrix,
    scale: usize,
    /// The longer side an image is first scaled to.
    longest_edge: usize,
}

impl Idefics3 {
    /// Reads the projector of a tower of `shape`.
    pub fn load(g: &mut GgufFile, shape: &TowerShape) -> Result<Self, EngineError> {
        let scale = g
            .meta
            .u32("clip.vision.projector.scale_factor")
            .unwrap_or(2) as usize;
        if !(2..=16).contains(&scale) {
            return Err(EngineError::InvalidModel(format!(
                "Idefics3 projector scale factor {scale}"
            )));
        }
        // Files converted before llama.cpp wrote this key are tiled by another rule.
        let longest_edge = g.meta.u32("clip.vision.preproc_image_size").map_err(|_| {
            EngineError::Unsupported(
                "an Idefics3 projector without `clip.vision.preproc_image_size` (converted \
                     by an older llama.cpp: convert it again)"
                    .into(),
            )
        })? as usize;
        if !(shape.image_size..=16384).contains(&longest_edge) {
            return Err(EngineError::InvalidModel(format!(
                "Idefics3 preprocessing to {longest_edge} pixels for {}-pixel tiles",
                shape.image_size
            )));
        }
        let dims = g.dims("mm.model.fc.weight")?;
        if dims.len() != 2 || dims[1] != shape.hidden * scale * scale {
            return Err(EngineError::InvalidModel(format!(
                "mm.model.fc.weight: {dims:?}, expected {} inputs ({} x {scale}^2)",
                shape.hidden * scale * scale,
                shape.hidden
            )));
        }
        let projection = g.matmul("mm.model.fc.weight")?;
        Ok(Self {
            projection,
            scale,
            longest_edge,
        })
    }

    /// The text model's width the projection ends in.
    pub fn text_hidden(&self) -> usize {
        self.projection.rows()
    }

    /// Tokens of one tile (or of the global view).
    pub fn tokens(&self, shape: &TowerShape) -> usize {
        shape.grid().div_ceil(self.scale).pow(2)
    }

    /// The tiles and the global view of `image`, with the text around them.
    pub fn layout(&self, image: &RgbImage, shape: &TowerShape) -> Vec<ImagePart> {
        let (tile, long) = (shape.image_size, self.longest_edge);
        let (w, h) = (image.width, image.height);
        // In f64 and truncated, as mtmd computes it; at least one pixel, where mtmd would
        // stop on an image a thousand times wider than high.
        let aspect = w as f64 / h as f64;
        let even = |n: usize| n + n % 2;
        let (rw, rh) = if w >= h {
            (long, even(((long as f64 / aspect) as usize).max(1)))
        } else {
            (even(((long as f64 * aspect) as usize).max(1)), long)
        };
        let (cols, rows) = (rw.div_ceil(tile), rh.div_ceil(tile));
        let scaled = resize(image, rw, rh, Filter::Lanczos);
        let refined = resize(&scaled, cols * tile, rows * tile, Filter::Lanczos);
        let overview = resize(&refined, tile, tile, Filter::Lanczos);
        let tokens = self.tokens(shape);
        let mut parts = Vec::with_capacity(3 * rows * cols + 3);
        for y in 0..rows {
            for x in 0..cols {
                parts.push(ImagePart::Text(format!(
                    "<fake_token_around_image><row_{}_col_{}>",
                    y + 1,
                    x + 1
                )));
                parts.push(ImagePart::View {
                    pixels: crop(&refined, x * tile, y * tile, tile, tile),
                    tokens,
                });
            }
            if y + 1 < rows {
                parts.push(ImagePart::Text("\n".into()));
            }
        }
        parts.push(ImagePart::Text(
            "\n\n<fake_token_around_image><global-img>".into(),
        ));
        parts.push(ImagePart::View {
            pixels: overview,
            tokens,
        });
        parts.push(ImagePart::Text("<fake_token_around_image>".into()));
        parts
    }

    /// A tile's tokens' embeddings from the tower's output: the patch grid padded with
    /// zeros to whole `scale x scale` windows, each window one row of its patches'
    /// values (row by row, then column, then channel), projected.
    pub fn project(&self, x: &[f32], shape: &TowerShape) -> Result<Vec<f32>, EngineError> {
        let (g, d, s) = (shape.grid(), shape.hidden, self.scale);
        let side = g.div_ceil(s);
        let width = d * s * s;
        let mut folded = vec![0f32; side * side * width];
        for (t, out) in folded.chunks_exact_mut(width).enumerate() {
            let (ty, tx) = (t / side, t % side);
            for ky in 0..s {
                for kx in 0..s {
                    let (py, px) = (ty * s + ky, tx * s + kx);
                    if py < g && px < g {
                        out[(ky * s + kx) * d..][..d].copy_from_slice(&x[(py * g + px) * d..][..d]);
                    }
                }
            }
        }
        let kernels = vec![RowKernel::GemvInWideBatch; side * side];
        self.projection.matmul(&folded, &kernels)
    }
}
