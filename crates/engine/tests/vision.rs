//! The vision model on ferrite-synth's random-weight projectors: an image encodes to the
//! rows llama.cpp's `mtmd` gives it (`fixtures/vision/<projector>-embeddings.json`), the
//! same in pieces as in one go, different for a different image, and a file that is no
//! projector is refused. (The answers of a text model reading them, against
//! llama-server's, are e2e/test_vision.py's.)

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferrite_engine::vision::{self, ImageLimits, ImagePart, ProjectorKind, RgbImage, VisionModel};
use ferrite_synth::{write_projector, Arch, Projector, ProjectorSpec, VisionShape, WeightType};

/// A scratch folder of this test's own.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferrite-vision-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The text architecture a projector's fixtures pair it with.
fn text_arch(projector: Projector) -> Arch {
    match projector {
        Projector::Gemma3 => Arch::Gemma3,
        Projector::Idefics3 => Arch::Llama,
        Projector::Qwen25Vl => Arch::Qwen2Vl,
    }
}

/// The projector types ferrite reads, as ferrite-synth names them.
fn read_types() -> Vec<Projector> {
    ProjectorKind::ALL
        .iter()
        .map(|k| {
            Projector::ALL
                .into_iter()
                .find(|p| p.type_name() == k.name())
                .expect("ferrite-synth writes it")
        })
        .collect()
}

fn projector(dir: &Path, projector: Projector) -> VisionModel {
    projector_of_shape(dir, projector, projector.small_shape())
}

fn projector_of_shape(dir: &Path, projector: Projector, shape: VisionShape) -> VisionModel {
    let spec = ProjectorSpec {
        projector,
        shape,
        text_hidden: text_arch(projector).small_shape().hidden,
        weights: WeightType::F16,
        seed: 0,
    };
    let path = dir.join(format!(
        "mmproj-{}-{}.gguf",
        projector.name(),
        shape.longest_edge
    ));
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

/// Each of images.py's pictures gives llama.cpp's rows, every view's in order:
/// preprocessing (Gemma 3's letterbox, Idefics3's tiles, Pillow's fixed-point resizes),
/// the tower and the projector, to a few ulps of f16: relative to the rows' mean size,
/// within 4e-3 at worst and 6e-4 on average (seen: Gemma 3 1.4e-3 and 2.4e-4, Idefics3,
/// whose projection sums 512 f16-rounded inputs, 2.6e-3 and 5e-4; llama.cpp's own rows
/// move by 1.5e-3 between its flash-attention and plain paths). A view out of place or
/// a pixel resampled differently moves them by hundredths or more.
#[test]
fn the_projector_gives_llama_cpps_rows() {
    use base64::Engine as _;
    let dir = scratch("rows");
    for file in common::fixture_files("vision") {
        let name = file.file_name().unwrap().to_str().unwrap().to_string();
        let Some(kind) = name.strip_suffix("-embeddings.json") else {
            continue;
        };
        // `<projector>-legacy`: a file without `preproc_image_size` (older converters').
        let (kind, legacy) = match kind.strip_suffix("-legacy") {
            Some(kind) => (kind, true),
            None => (kind, false),
        };
        let kind = Projector::from_name(kind).expect("a projector's fixture");
        let fixture = common::fixture(&format!("vision/{name}"));
        let mut shape = kind.small_shape();
        if legacy {
            shape.longest_edge = 0;
        }
        let vision = projector_of_shape(&dir, kind, shape);
        for case in fixture["cases"].as_array().unwrap() {
            let what = case["name"].as_str().unwrap();
            let size = case["size"].as_array().unwrap();
            let (w, h) = (
                size[0].as_u64().unwrap() as usize,
                size[1].as_u64().unwrap() as usize,
            );
            // The JPEG photo: llama.cpp's rows come from stb_image's pixels. From the same
            // pixels ferrite's rows are as close as a PNG's; from its own decoder's, within
            // JPEG_ROWS.
            let images = match case["file"].as_str() {
                Some(file) => vec![
                    (stb_pixels(file), rows_bounds(kind), "stb_image's pixels"),
                    (
                        jpeg(file, &case["file_sha256"]),
                        JPEG_ROWS,
                        "ferrite's decoder",
                    ),
                ],
                None => {
                    let pixels = pattern(w, h, case["seed"].as_u64().unwrap() as usize);
                    assert_eq!(
                        sha256(&pixels),
                        case["pixels_sha256"].as_str().unwrap(),
                        "{what}: pixels"
                    );
                    vec![(RgbImage::new(w, h, pixels), rows_bounds(kind), "drawn")]
                }
            };
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(case["f32_base64"].as_str().unwrap())
                .unwrap();
            let want: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            for (image, (max_bound, mean_bound), pixels) in images {
                let got = vision.encode(&image).unwrap();
                assert_eq!(got.len(), want.len(), "{what}: rows");
                let diffs: Vec<f32> = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).collect();
                let worst = diffs.iter().cloned().fold(0.0, f32::max);
                let mean = diffs.iter().sum::<f32>() / diffs.len() as f32;
                let size = want.iter().map(|v| v.abs()).sum::<f32>() / want.len() as f32;
                assert!(
                    worst < max_bound * size && mean < mean_bound * size,
                    "{} / {what} ({pixels}): rows differ from llama.cpp's by up to {worst} \
                     (mean {mean}), where they are {size} in size",
                    name.trim_end_matches("-embeddings.json")
                );
            }
        }
    }
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The committed JPEG file `name` (its SHA-256 as the fixture recorded it), decoded by
/// ferrite.
fn jpeg(name: &str, sha256_recorded: &serde_json::Value) -> RgbImage {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/vision")
        .join(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        sha256(&bytes),
        sha256_recorded.as_str().unwrap(),
        "{name}: the file the fixture was recorded from"
    );
    vision::decode(&bytes, &ImageLimits::default()).unwrap()
}

/// How far ferrite's rows may be from llama.cpp's, relative to their mean size: at worst
/// and on average.
const ROWS: (f32, f32) = (4e-3, 6e-4);

/// The same for Qwen2.5-VL, whose rows go through two f16 products after the tower (its
/// merger: 512 inputs each on the small tower) and whose small picture is scaled up
/// (40x40 to 84x84: smooth patches, the tower's differences grown through its norms).
/// Seen: 3.9e-3 and 6.9e-4 on the drawn pictures, 1.1e-2 and 1.6e-3 on the small one,
/// whose 84x84 view is mtmd's to the byte (mtmd given ferrite's view gives the same rows
/// as from the 40x40 picture). Every block attending to the whole image instead of its
/// windows moves them by whole units (seen: 4.3 and 0.73).
const QWEN_ROWS: (f32, f32) = (1.5e-2, 2e-3);

/// The bounds of [`ROWS`] for `kind`'s rows.
fn rows_bounds(kind: Projector) -> (f32, f32) {
    match kind {
        Projector::Qwen25Vl => QWEN_ROWS,
        Projector::Gemma3 | Projector::Idefics3 => ROWS,
    }
}

/// The same for the JPEG photo decoded by ferrite (zune-jpeg, through the `image` crate),
/// where llama.cpp's rows come from stb_image's pixels, a unit or three apart
/// (`jpeg_pixels_are_stb_images_within_three_units`): what this measures is the pixels'
/// difference carried through the random-weight tower, ten to thirty times a PNG's
/// (seen: Gemma 3 4.0e-2 and 5.4e-3, Idefics3 1.5e-1 and 1.2e-2; rows of another picture
/// are whole units off). Its effect on answers is e2e/test_vision.py's "a JPEG photo".
const JPEG_ROWS: (f32, f32) = (0.25, 0.025);

/// The pixels llama.cpp decodes from the JPEG file `name` (stb_image;
/// `fixtures/vision/jpeg-stb.json`).
fn stb_pixels(name: &str) -> RgbImage {
    use base64::Engine as _;
    use std::io::Read as _;
    let fixture = common::fixture("vision/jpeg-stb.json");
    let file = fixture["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["file"] == name)
        .unwrap_or_else(|| panic!("jpeg-stb.json has no {name}"));
    let packed = base64::engine::general_purpose::STANDARD
        .decode(file["rgb_zlib_base64"].as_str().unwrap())
        .unwrap();
    let mut pixels = Vec::new();
    flate2::read::ZlibDecoder::new(&packed[..])
        .read_to_end(&mut pixels)
        .unwrap();
    let size = file["size"].as_array().unwrap();
    let (w, h) = (
        size[0].as_u64().unwrap() as usize,
        size[1].as_u64().unwrap() as usize,
    );
    assert_eq!(pixels.len(), w * h * 3, "{name}: stb's bytes");
    RgbImage::new(w, h, pixels)
}

/// ferrite's JPEG decoder against llama.cpp's (stb_image, as llama-server decodes a
/// client's image; `fixtures/vision/jpeg-stb.json`), on the photo in four kinds of JPEG:
/// the sizes agree and no sample is more than 3 apart. Seen: baseline and progressive
/// 4:2:0, 21% of samples differ (mean 0.28: the chroma upsampling rounds differently);
/// 4:4:4, 1.5% (mean 0.017: the inverse DCT's and colour conversion's rounding); grey,
/// 0.4%, by 1. A channel order swapped or a picture shifted by a pixel moves them by tens.
#[test]
fn jpeg_pixels_are_stb_images_within_three_units() {
    let fixture = common::fixture("vision/jpeg-stb.json");
    let files = fixture["files"].as_array().unwrap();
    assert_eq!(files.len(), 4);
    for file in files {
        let name = file["file"].as_str().unwrap();
        let ours = jpeg(name, &file["file_sha256"]);
        let stb = stb_pixels(name);
        assert_eq!(
            (ours.width, ours.height),
            (stb.width, stb.height),
            "{name}: size"
        );
        let diffs: Vec<u32> = ours
            .pixels
            .iter()
            .zip(&stb.pixels)
            .map(|(a, b)| a.abs_diff(*b) as u32)
            .collect();
        let worst = diffs.iter().copied().max().unwrap();
        let mean = diffs.iter().sum::<u32>() as f64 / diffs.len() as f64;
        let differing = diffs.iter().filter(|d| **d > 0).count() as f64 / diffs.len() as f64;
        assert!(
            worst <= 3 && mean < 0.6 && differing < 0.45,
            "{name}: ferrite's pixels differ from stb_image's by up to {worst} (mean {mean:.3}, \
             {:.1}% of samples)",
            differing * 100.0
        );
    }
}

/// The views of an image's layout, with their positions.
fn views(parts: &[ImagePart]) -> Vec<(&RgbImage, usize)> {
    parts
        .iter()
        .filter_map(|p| match p {
            ImagePart::View { pixels, tokens } => Some((pixels, *tokens)),
            ImagePart::Text(_) => None,
        })
        .collect()
}

#[test]
fn an_image_encodes_the_same_in_pieces_as_in_one_go() {
    let dir = scratch("pieces");
    for kind in read_types() {
        let vision = projector(&dir, kind);
        let image = picture(300, 120, 1);
        let layout = vision.layout(&image);
        let views = views(&layout);
        let positions: usize = views.iter().map(|v| v.1).sum();
        let whole = vision.encode(&image).unwrap();
        let width = vision.text_hidden();
        assert_eq!(whole.len(), positions * width, "{}", kind.name());
        assert!(whole.iter().all(|v| v.is_finite()));
        // The last view in pieces of 7 patches: the same rows as in one go.
        let (last, tokens) = *views.last().unwrap();
        assert_eq!(vision.view_tokens(last), Some(tokens));
        let mut encoding = vision.start_encoding(last);
        let mut pieces = 0;
        let rows = loop {
            pieces += 1;
            if let Some(rows) = vision.continue_encoding(&mut encoding, 7).unwrap() {
                break rows;
            }
        };
        assert!(pieces > 10, "{pieces} pieces");
        assert_eq!(
            rows,
            whole[whole.len() - tokens * width..],
            "{}: in pieces of 7 patches",
            kind.name()
        );
        let other = vision.encode(&picture(300, 120, 2)).unwrap();
        let moved = whole.iter().zip(&other).filter(|(a, b)| a != b).count();
        assert!(moved > whole.len() / 2, "another image gives other rows");
    }
}

#[test]
fn the_gemma3_projector_gives_sixteen_tokens_from_the_small_tower() {
    let dir = scratch("gemma3");
    let vision = Arc::new(projector(&dir, Projector::Gemma3));
    let layout = vision.layout(&picture(10, 10, 0));
    assert_eq!(layout.len(), 3);
    assert_eq!(layout[0], ImagePart::Text("<start_of_image>".into()));
    assert_eq!(views(&layout)[0].1, 16);
    assert_eq!(views(&layout)[0].0.width, 224);
    assert_eq!(layout[2], ImagePart::Text("<end_of_image>".into()));
    assert_eq!(vision.text_hidden(), Arch::Gemma3.small_shape().hidden);
    assert!(vision.bidirectional());
    assert_eq!(vision.view_tokens(&picture(10, 10, 0)), None);
}

/// SmolVLM's layout on the small tower (128-pixel tiles, images scaled to 384 on their
/// longer side): a 300x120 image is 384x154, three tiles by two, each after its row and
/// column, a newline between the rows, then the global view.
#[test]
fn the_idefics3_projector_tiles_an_image_row_by_row_then_adds_the_global_view() {
    let dir = scratch("idefics3");
    let vision = projector(&dir, Projector::Idefics3);
    assert!(!vision.bidirectional());
    let texts = |image: &RgbImage| -> Vec<String> {
        vision
            .layout(image)
            .into_iter()
            .map(|p| match p {
                ImagePart::Text(t) => t,
                ImagePart::View { pixels, tokens } => {
                    assert_eq!((pixels.width, pixels.height, tokens), (128, 128, 16));
                    "[view]".into()
                }
            })
            .collect()
    };
    let tile = |r, c| format!("<fake_token_around_image><row_{r}_col_{c}>");
    let mut want = Vec::new();
    for r in 1..=2 {
        for c in 1..=3 {
            want.extend([tile(r, c), "[view]".into()]);
        }
        if r == 1 {
            want.push("\n".into());
        }
    }
    want.extend([
        "\n\n<fake_token_around_image><global-img>".into(),
        "[view]".into(),
        "<fake_token_around_image>".into(),
    ]);
    assert_eq!(texts(&picture(300, 120, 1)), want);
    // Tall: 120x300 is 154x384, two tiles by three. A small image is scaled up: 3x3.
    let tall = texts(&picture(120, 300, 1));
    assert_eq!(tall.iter().filter(|t| *t == "[view]").count(), 7);
    assert!(tall.contains(&tile(3, 2)) && !tall.contains(&tile(2, 3)));
    let small = texts(&picture(10, 10, 0));
    assert_eq!(small.iter().filter(|t| *t == "[view]").count(), 10);
    assert!(small.contains(&tile(3, 3)));
    // An image a thousand times wider than high still has a tile's row.
    assert_eq!(texts(&picture(4000, 2, 0)).len(), 3 * 2 + 3);
}

/// Qwen2.5-VL's layout on the small tower (14-pixel patches, a token per 2x2): a 300x120
/// image is letterboxed into 308x112 (its sides rounded to 28 pixels), 11x4 = 44 tokens
/// on a grid 11 wide, between the vision markers, read causally; a 10x10 one is scaled
/// up to the 8 tokens' least (84x84: 3x3).
#[test]
fn the_qwen25vl_projector_reads_an_image_at_its_own_size() {
    let dir = scratch("qwen25vl");
    let vision = projector(&dir, Projector::Qwen25Vl);
    assert!(!vision.bidirectional());
    assert_eq!(vision.text_hidden(), Arch::Qwen2Vl.small_shape().hidden);
    let layout = vision.layout(&picture(300, 120, 1));
    assert_eq!(layout.len(), 3);
    assert_eq!(layout[0], ImagePart::Text("<|vision_start|>".into()));
    assert_eq!(layout[2], ImagePart::Text("<|vision_end|>".into()));
    let (view, tokens) = views(&layout)[0];
    assert_eq!((view.width, view.height, tokens), (308, 112, 44));
    assert_eq!(vision.positions(300, 120), 44);
    assert_eq!(vision.view_tokens(view), Some(44));
    assert_eq!(vision.grid_columns(view), Some(11));
    assert_eq!(vision.positions(10, 10), 9);
    // A view whose sides are not whole tokens is none the tower reads.
    assert_eq!(vision.view_tokens(&picture(300, 120, 1)), None);
    assert_eq!(
        vision.encode(&picture(300, 120, 1)).unwrap().len(),
        44 * vision.text_hidden()
    );
}

/// A projector type ferrite does not read (Qwen2.5-VL's file with its type renamed) is
/// refused: loading it is an error that names the type.
#[test]
fn a_projector_ferrite_does_not_read_is_refused_by_its_type() {
    let dir = scratch("unread");
    let spec = ProjectorSpec {
        projector: Projector::Qwen25Vl,
        shape: Projector::Qwen25Vl.small_shape(),
        text_hidden: Arch::Qwen2Vl.small_shape().hidden,
        weights: WeightType::F16,
        seed: 0,
    };
    let path = dir.join("mmproj-unread.gguf");
    write_projector(&spec, &path).unwrap();
    // The same file with another type's name (as long, so the file stays whole).
    let bytes = std::fs::read(&path).unwrap();
    let (from, to) = (b"qwen2.5vl_merger", b"qwen2.5vl_mergex");
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("the type's name");
    let mut renamed = bytes.clone();
    renamed[at..at + to.len()].copy_from_slice(to);
    std::fs::write(&path, renamed).unwrap();
    let error = VisionModel::load(&path).err().expect("an unknown type");
    assert!(error.to_string().contains("qwen2.5vl_mergex"), "{error}");
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
