//! Qwen2.5-VL's projector (`clip.projector_type = qwen2.5vl_merger`): images of any size,
//! each read whole at its own resolution by the windowed tower, every 2x2 patches merged
//! into one token by a two-layer GELU network, and the tokens placed on a grid of the
//! text model's multi-section rotary positions.
//!
//! Preprocessing follows `mtmd`'s: the image's sides rounded to multiples of two patches
//! (28 pixels for 14-pixel patches), the area then brought within 8 to 4096 tokens (its
//! sides scaled together, rounded down or up to the multiple), and the image letterboxed
//! into that size (bicubic, black bars, centred). The tower reads the patches unit by
//! unit (a 2x2 group's four in a row), the units window by window (4x4 units: 112 pixels),
//! so that its windowed blocks attend within runs of rows; the merged tokens come back in
//! raster order. In the prompt the tokens sit between `<|vision_start|>` and
//! `<|vision_end|>`, and the text model places them on a grid (`model::ImageGrid`).

use super::image::RgbImage;
use super::layers::Linear;
use super::resize::{letterbox_into, Filter};
use super::tower::{PatchLayout, TowerShape};
use super::ImagePart;
use crate::error::EngineError;
use crate::gguf::GgufFile;
use crate::model::ops;

/// Patches a side of a merged token (llama.cpp's graph takes 2 whatever the file says).
const MERGE: usize = 2;
/// Fewest and most tokens an image takes (`mtmd`'s defaults for this projector).
const MIN_TOKENS: usize = 8;
const MAX_TOKENS: usize = 4096;
/// Side of an attention window, in pixels.
const WINDOW_PIXELS: usize = 112;

/// The merger's two layers.
pub(super) struct Qwen25Vl {
    first: Linear,
    second: Linear,
}

impl Qwen25Vl {
    /// Reads the merger of a tower of `shape`.
    pub fn load(g: &mut GgufFile, shape: &TowerShape) -> Result<Self, EngineError> {
        let merged = shape.hidden * MERGE * MERGE;
        let first = Linear::load(g, "mm.0")?;
        let second = Linear::load(g, "mm.2")?;
        if first.inputs() != merged || second.inputs() != first.outputs() {
            return Err(EngineError::InvalidModel(format!(
                "Qwen2.5-VL merger of {} -> {} -> {} values for {merged}-value units",
                first.inputs(),
                first.outputs(),
                second.outputs()
            )));
        }
        Ok(Self { first, second })
    }

    /// The text model's width the merger ends in.
    pub fn text_hidden(&self) -> usize {
        self.second.outputs()
    }

    /// The image, letterboxed to its size in whole tokens, between the vision markers.
    pub fn layout(&self, image: &RgbImage, shape: &TowerShape) -> Vec<ImagePart> {
        let (width, height) = target_size(image.width, image.height, shape.patch_size);
        vec![
            ImagePart::Text("<|vision_start|>".into()),
            ImagePart::View {
                pixels: letterbox_into(image, width, height, Filter::Bicubic),
                tokens: tokens(width, height, shape.patch_size),
            },
            ImagePart::Text("<|vision_end|>".into()),
        ]
    }

    /// The tokens an image of `width` x `height` takes, known before it is preprocessed.
    pub fn positions(&self, width: usize, height: usize, shape: &TowerShape) -> usize {
        let (w, h) = target_size(width, height, shape.patch_size);
        tokens(w, h, shape.patch_size)
    }

    /// The tokens of a view, if it is one [`Self::layout`] gives.
    pub fn view_tokens(&self, view: &RgbImage, shape: &TowerShape) -> Option<usize> {
        let align = shape.patch_size * MERGE;
        let whole = view.width.is_multiple_of(align) && view.height.is_multiple_of(align);
        let n = tokens(view.width, view.height, shape.patch_size);
        (whole && (1..=MAX_TOKENS).contains(&n)).then_some(n)
    }

    /// Tokens across a view: its grid of rotary positions' width.
    pub fn grid_columns(&self, view: &RgbImage, shape: &TowerShape) -> usize {
        view.width / (shape.patch_size * MERGE)
    }

    /// The tower's rows for a view: each 2x2 unit's four patches in a row (top left, top
    /// right, bottom left, bottom right), the units window by window and in raster order
    /// within a window, the windows in raster order.
    pub fn patch_layout(&self, view: &RgbImage, shape: &TowerShape) -> PatchLayout {
        let p = shape.patch_size;
        let (columns, rows) = (view.width / p, view.height / p);
        let (mx, my) = (columns / MERGE, rows / MERGE);
        let window = (WINDOW_PIXELS / p / MERGE).max(1);
        let mut order = Vec::with_capacity(mx * my * MERGE * MERGE);
        let mut windows = Vec::new();
        for wy in (0..my).step_by(window) {
            for wx in (0..mx).step_by(window) {
                let first = order.len();
                for uy in wy..my.min(wy + window) {
                    for ux in wx..mx.min(wx + window) {
                        for dy in 0..MERGE {
                            for dx in 0..MERGE {
                                order.push((uy * MERGE + dy) * columns + ux * MERGE + dx);
                            }
                        }
                    }
                }
                windows.push(first..order.len());
            }
        }
        PatchLayout {
            columns,
            rows,
            order,
            windows,
        }
    }

    /// The tokens' embeddings from the tower's output (rows in `layout`'s order): each
    /// unit's four rows as one, through the merger, put back in raster order.
    pub fn project(&self, x: &[f32], layout: &PatchLayout) -> Result<Vec<f32>, EngineError> {
        let units = layout.order.len() / (MERGE * MERGE);
        let mut h = self.first.apply(x, units)?;
        ops::gelu_in_place(&mut h);
        let merged = self.second.apply(&h, units)?;
        let width = self.text_hidden();
        let mx = layout.columns / MERGE;
        let mut out = vec![0f32; merged.len()];
        for (j, row) in merged.chunks_exact(width).enumerate() {
            let (py, px) = layout.place(j * MERGE * MERGE);
            let unit = py / MERGE * mx + px / MERGE;
            out[unit * width..][..width].copy_from_slice(row);
        }
        Ok(out)
    }
}

/// Tokens of a view of `width` x `height`.
fn tokens(width: usize, height: usize, patch: usize) -> usize {
    let align = patch * MERGE;
    (width / align) * (height / align)
}

/// The size `mtmd` resizes an image to ("smart resize", in f32 as it computes it): each
/// side rounded (halves away from zero) to a multiple of two patches, then, if the area
/// is over [`MAX_TOKENS`] tokens, both sides scaled down by one factor and rounded down,
/// or if under [`MIN_TOKENS`], scaled up and rounded up.
pub(super) fn target_size(width: usize, height: usize, patch: usize) -> (usize, usize) {
    let align = patch * MERGE;
    let f = align as f32;
    let area = align * align;
    let (most, least) = (MAX_TOKENS * area, MIN_TOKENS * area);
    let by = |x: f32, round: fn(f32) -> f32| round(x / f) as usize * align;
    let (wf, hf) = (width as f32, height as f32);
    let (mut w, mut h) = (by(wf, f32::round).max(align), by(hf, f32::round).max(align));
    if w * h > most {
        let beta = (hf * wf / most as f32).sqrt();
        (w, h) = (
            by(wf / beta, f32::floor).max(align),
            by(hf / beta, f32::floor).max(align),
        );
    } else if w * h < least {
        let beta = (least as f32 / (hf * wf)).sqrt();
        (w, h) = (by(wf * beta, f32::ceil), by(hf * beta, f32::ceil));
    }
    (w, h)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// mtmd's worked sizes: 640x480 to 644x476 (23x17 tokens), a small image up to 8
    /// tokens at least, a huge one down to 4096 at most, halves rounded away from zero.
    #[test]
    fn images_are_sized_as_mtmd_sizes_them() {
        assert_eq!(target_size(640, 480, 14), (644, 476));
        assert_eq!(target_size(224, 224, 14), (224, 224));
        // 70 / 28 = 2.5: three units, not two.
        assert_eq!(target_size(70, 300, 14), (84, 308));
        let (w, h) = target_size(40, 40, 14);
        assert!(tokens(w, h, 14) >= MIN_TOKENS, "{w}x{h}");
        let (w, h) = target_size(8000, 6000, 14);
        assert!(tokens(w, h, 14) <= MAX_TOKENS, "{w}x{h}");
        assert!(w % 28 == 0 && h % 28 == 0);
    }
}
