//! The vision model on ferrite-synth's random-weight projectors: an image encodes to the
//! rows llama.cpp's `mtmd` gives it (`fixtures/vision/<projector>-embeddings.json`), the
//! same in pieces as in one go, different for a different image, and a file that is no
//! projector is refused. (The answers of a text model reading them, against
//! llama-server's, are e2e/test_vision.py's.)

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferrite_engine::vision::{RgbImage, VisionModel};
use ferrite_synth::{write_projector, Arch, Projector, ProjectorSpec, WeightType};

/// A scratch folder of this test's own.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferrite-vision-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn projector(dir: &Path, projector: Projector) -> VisionModel {
    let spec = ProjectorSpec {
        projector,
        shape: projector.small_shape(),
        text_hidden: Arch::Gemma3.small_shape().hidden,
        weights: WeightType::F16,
        seed: 0,
    };
    let path = dir.join(format!("mmproj-{}.gguf", projector.name()));
    write_projector(&spec, &path).unwrap();
    VisionModel::load(&path).unwrap()
}

fn picture(width: usize, height: usize, seed: usize) -> RgbImage {
    let pixels = (0..width * height * 3)
        .map(|i| ((i * (7 + seed) + i / (3 * width) * 13) % 256) as u8)
        .collect();
    RgbImage::new(width, height, pixels)
}

/// `fixtures/images.py`'s `pixels`: the same formula (the fixture's SHA-256 of the bytes
/// says whether the two agree).
fn pattern(width: usize, height: usize, seed: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(width * height * 3);
    let radius = (width / (2 + seed % 3)) as i64;
    for y in 0..height {
        for x in 0..width {
            let r = (x * (3 + seed) + y * 2 + seed * 40) % 256;
            let g = ((x / (4 + seed)) * 37 + (y / 6) * 23 + seed * 17) % 256;
            let (dx, dy) = (
                x as i64 - (width / 2) as i64,
                y as i64 - (height / 3) as i64,
            );
            let b = if dx * dx + dy * dy < radius * radius {
                255
            } else {
                (x ^ y) % 256
            };
            out.extend([r as u8, g as u8, b as u8]);
        }
    }
    out
}

/// Each of images.py's pictures gives llama.cpp's rows: preprocessing (letterbox and
/// Pillow's fixed-point bilinear resize), the tower and the projector, to a few ulps of
/// f16 (llama.cpp's own rows move by 7e-4 between its flash-attention and plain paths).
#[test]
fn the_projector_gives_llama_cpps_rows() {
    use base64::Engine as _;
    use sha2::Digest;
    let dir = scratch("rows");
    for file in common::fixture_files("vision") {
        let name = file.file_name().unwrap().to_str().unwrap().to_string();
        let Some(kind) = name.strip_suffix("-embeddings.json") else {
            continue;
        };
        let kind = Projector::from_name(kind).expect("a projector's fixture");
        let fixture = common::fixture(&format!("vision/{name}"));
        let vision = projector(&dir, kind);
        for case in fixture["cases"].as_array().unwrap() {
            let what = case["name"].as_str().unwrap();
            let size = case["size"].as_array().unwrap();
            let (w, h) = (
                size[0].as_u64().unwrap() as usize,
                size[1].as_u64().unwrap() as usize,
            );
            let pixels = pattern(w, h, case["seed"].as_u64().unwrap() as usize);
            let digest: String = sha2::Sha256::digest(&pixels)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            assert_eq!(
                digest,
                case["pixels_sha256"].as_str().unwrap(),
                "{what}: pixels"
            );
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(case["f32_base64"].as_str().unwrap())
                .unwrap();
            let want: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            let got = vision.encode(&RgbImage::new(w, h, pixels)).unwrap();
            assert_eq!(got.len(), want.len(), "{what}: rows");
            let diffs: Vec<f32> = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).collect();
            let worst = diffs.iter().cloned().fold(0.0, f32::max);
            let mean = diffs.iter().sum::<f32>() / diffs.len() as f32;
            assert!(
                worst < 2e-3 && mean < 3e-4,
                "{} / {what}: rows differ from llama.cpp's by up to {worst} (mean {mean})",
                kind.name()
            );
        }
    }
}

#[test]
fn an_image_encodes_the_same_in_pieces_as_in_one_go() {
    let dir = scratch("pieces");
    for kind in Projector::ALL {
        let vision = projector(&dir, kind);
        let image = picture(300, 120, 1);
        let plan = vision.plan(&image);
        let whole = vision.encode(&image).unwrap();
        assert_eq!(
            whole.len(),
            plan.tokens * vision.text_hidden(),
            "{}",
            kind.name()
        );
        assert!(whole.iter().all(|v| v.is_finite()));
        let mut encoding = vision.start_encoding(&image);
        let mut pieces = 0;
        let rows = loop {
            pieces += 1;
            if let Some(rows) = vision.continue_encoding(&mut encoding, 7).unwrap() {
                break rows;
            }
        };
        assert!(pieces > 10, "{pieces} pieces");
        assert_eq!(rows, whole, "{}: in pieces of 7 patches", kind.name());
        let other = vision.encode(&picture(300, 120, 2)).unwrap();
        let moved = whole.iter().zip(&other).filter(|(a, b)| a != b).count();
        assert!(moved > whole.len() / 2, "another image gives other rows");
    }
}

#[test]
fn the_gemma3_projector_gives_sixteen_tokens_from_the_small_tower() {
    let dir = scratch("gemma3");
    let vision = Arc::new(projector(&dir, Projector::Gemma3));
    assert_eq!(vision.plan(&picture(10, 10, 0)).tokens, 16);
    assert_eq!(vision.text_hidden(), Arch::Gemma3.small_shape().hidden);
    assert!(vision.bidirectional());
    assert_eq!(vision.markers().begin, "<start_of_image>");
}

#[test]
fn a_file_that_is_no_projector_is_refused() {
    let error = VisionModel::load(&common::model_path("smollm2-135m"))
        .err()
        .expect("a text model is no projector");
    assert!(
        error.to_string().contains("not a vision projector"),
        "{error}"
    );
}
