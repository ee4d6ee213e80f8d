//! Idefics3's projector (`clip.projector_type = idefics3`: SmolVLM, SmolVLM2, Idefics3):
//! the image cut into tiles of the tower's size plus one global view of it, each tile's
//! patch grid folded `scale x scale` into the channels ("pixel shuffle") and projected
//! into the text model's width by one matrix without bias. SmolVLM's 512-pixel tiles in
//! 16-pixel patches at scale 4 give 8x8 = 64 tokens a tile.
//!
//! Preprocessing follows `mtmd`'s: the image scaled (Lanczos) so that its longer side is
//! `clip.vision.preproc_image_size`, the other side rounded down then up to even, scaled
//! again (Lanczos) to whole tiles, then cut row by row; the global view is that refined
//! image scaled (Lanczos) to one tile. A file without that key (converted before
//! llama.cpp wrote it) takes `mtmd`'s older rule: each side rounded to the nearest whole
//! tile (one at least), the image letterboxed into that (bicubic) and cut, the global
//! view the image scaled (bicubic) to one tile. In the prompt the tiles come first, each after
//! `<fake_token_around_image><row_R_col_C>`, rows ended by a newline, then the global
//! view between `\n\n<fake_token_around_image><global-img>` and
//! `<fake_token_around_image>`.

use super::image::RgbImage;
use super::resize::{crop, letterbox_into, resize, Filter};
use super::tower::TowerShape;
use super::ImagePart;
use crate::error::EngineError;
use crate::gguf::GgufFile;
use crate::quant::{QMatrix, RowKernel};

/// The projector's weights and preprocessing.
pub(super) struct Idefics3 {
    projection: QMatrix,
    scale: usize,
    /// The longer side an image is first scaled to (`None`: the older rule).
    longest_edge: Option<usize>,
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
        // Files converted before llama.cpp wrote this key are tiled by the older rule.
        let longest_edge = g
            .meta
            .u32("clip.vision.preproc_image_size")
            .ok()
            .map(|n| n as usize);
        if let Some(long) = longest_edge {
            if !(shape.image_size..=16384).contains(&long) {
                return Err(EngineError::InvalidModel(format!(
                    "Idefics3 preprocessing to {long} pixels for {}-pixel tiles",
                    shape.image_size
                )));
            }
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
        let tile = shape.image_size;
        let (w, h) = self.refined_size(image.width, image.height, tile);
        let (refined, overview) = match self.longest_edge {
            Some(long) => {
                // Lanczos throughout: to the longer side, to whole tiles, the global view
                // from the refined image.
                let (sw, sh) = scaled_size(image.width, image.height, long);
                let scaled = resize(image, sw, sh, Filter::Lanczos);
                let refined = resize(&scaled, w, h, Filter::Lanczos);
                let overview = resize(&refined, tile, tile, Filter::Lanczos);
                (refined, overview)
            }
            None => (
                letterbox_into(image, w, h, Filter::Bicubic),
                resize(image, tile, tile, Filter::Bicubic),
            ),
        };
        let (cols, rows) = (refined.width / tile, refined.height / tile);
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

    /// The prompt positions `image` takes, without preprocessing it: its tiles' and its
    /// global view's.
    pub fn positions(&self, width: usize, height: usize, shape: &TowerShape) -> usize {
        let tile = shape.image_size;
        let (w, h) = self.refined_size(width, height, tile);
        (w / tile * (h / tile) + 1) * self.tokens(shape)
    }

    /// The size, in whole tiles, an image of `width` x `height` is cut from: scaled to its
    /// longer side then rounded up to tiles, or, by the older rule, each side rounded to
    /// the nearest tile (in f32, halves away from zero; one tile at least).
    fn refined_size(&self, width: usize, height: usize, tile: usize) -> (usize, usize) {
        match self.longest_edge {
            Some(long) => {
                let (w, h) = scaled_size(width, height, long);
                (w.div_ceil(tile) * tile, h.div_ceil(tile) * tile)
            }
            None => {
                let round = |n: usize| ((n as f32 / tile as f32).round() as usize).max(1) * tile;
                (round(width), round(height))
            }
        }
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

/// The size `mtmd` first scales an image to: its longer side `long`, the other in
/// proportion (in f64, truncated, at least one pixel) and made even.
fn scaled_size(width: usize, height: usize, long: usize) -> (usize, usize) {
    let aspect = width as f64 / height as f64;
    let even = |n: usize| n + n % 2;
    if width >= height {
        (long, even(((long as f64 / aspect) as usize).max(1)))
    } else {
        (even(((long as f64 * aspect) as usize).max(1)), long)
    }
}
