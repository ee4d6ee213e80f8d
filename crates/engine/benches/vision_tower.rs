//! Speed of a vision tower: one image through ferrite-synth's random-weight Gemma 3 4B
//! tower (SigLIP at 896 pixels, 4,096 patches of 1,152, 16 heads) cut to a few blocks
//! (`--layers N`, default 2: every block costs the same), or Qwen2.5-VL's
//! (`--projector qwen2.5vl`, a 672x672 image: 2,304 patches of 1,280). Prints the seconds
//! per block of the fastest of `--runs` encodings (default 2), on the compute threads
//! (`--threads N`, default 2), in one go or in pieces of `--piece N` rows (as the engine
//! runs it between steps). `bench/vision.py` measures the whole tower against
//! llama-server; this is for profiling (`perf record`) its kernels.
//!
//!     cargo bench -p ferrite-engine --bench vision_tower [-- --layers 2 --runs 2]

use std::time::Instant;

use ferrite_engine::vision::{ImagePart, RgbImage, VisionModel};
use ferrite_synth::vision::{write_projector, Projector, ProjectorSpec};
use ferrite_synth::WeightType;

/// The value of `--name` in `args`, parsed.
fn option<T: std::str::FromStr>(args: &[String], name: &str) -> Option<T> {
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1)?.parse().ok()
}

/// The image's one view, as the projector lays it out.
fn image_view(vision: &VisionModel, image: &RgbImage) -> RgbImage {
    vision
        .layout(image)
        .into_iter()
        .find_map(|part| match part {
            ImagePart::View { pixels, .. } => Some(pixels),
            ImagePart::Text(_) => None,
        })
        .expect("a view")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads = option(&args, "--threads").unwrap_or(2);
    let layers = option(&args, "--layers").unwrap_or(2);
    let runs = option(&args, "--runs").unwrap_or(2);
    let piece = option(&args, "--piece").unwrap_or(usize::MAX);
    let projector = option::<String>(&args, "--projector").unwrap_or_else(|| "gemma3".into());
    let projector = Projector::from_name(&projector).expect("--projector gemma3 or qwen2.5vl");
    let dir = std::env::temp_dir().join(format!("ferrite-vision-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mmproj.gguf");
    let mut shape = projector.full_shape();
    shape.layers = layers;
    let spec = ProjectorSpec {
        projector,
        shape,
        text_hidden: 2560,
        weights: WeightType::F16,
        seed: 0,
    };
    write_projector(&spec, &path).unwrap();
    let vision = VisionModel::load(&path).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    let side = match projector {
        Projector::Qwen25Vl => 672,
        _ => shape.image_size,
    };
    let pixels = (0..side * side * 3).map(|i| (i * 7 % 251) as u8).collect();
    let image = RgbImage::new(side, side, pixels);
    let best = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(|| {
            (0..runs)
                .map(|_| {
                    let started = Instant::now();
                    let mut encoding = vision.start_encoding(&image_view(&vision, &image));
                    while vision
                        .continue_encoding(&mut encoding, piece)
                        .unwrap()
                        .is_none()
                    {}
                    started.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min)
        });
    println!(
        "{}: {side}x{side} image, {layers} block(s): {best:.2} s, {:.2} s per block \
         ({threads} thread(s), the fastest of {runs})",
        projector.name(),
        best / layers as f64
    );
}
