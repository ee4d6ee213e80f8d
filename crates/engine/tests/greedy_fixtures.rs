//! Our forward pass reproduces llama.cpp's greedy continuations: the first 8 tokens at
//! least, with the chosen token's log-probability within 0.05 at every matching step.

mod common;

use ferrite_engine::model::{self, BatchEntry};
use ferrite_engine::sampling::log_softmax;

const MIN_MATCHING: usize = 8;
const LOGPROB_TOLERANCE: f32 = 0.05;

#[test]
fn greedy_decoding_matches_llama_cpp() {
    for (name, fixture) in common::MODELS {
        let (_gguf, model) = model::load_path(&common::model_path(name)).unwrap();
        let data = common::fixture(fixture);
        for case in data["greedy_16"].as_array().unwrap() {
            let prompt: Vec<u32> = case["prompt_ids_with_special"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            let steps = case["steps"].as_array().unwrap();
            let mut cache = model.new_cache(prompt.len() + steps.len());
            let mut input = prompt.clone();
            let mut matched = 0;
            for step in steps {
                let logits = model
                    .forward(&mut [BatchEntry {
                        tokens: &input,
                        cache: &mut cache,
                        want_logits: true,
                    }])
                    .unwrap()
                    .remove(0);
                let logprobs = log_softmax(&logits);
                let best = logprobs
                    .iter()
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(b.1))
                    .map(|(i, _)| i as u32)
                    .unwrap();
                let want = step["id"].as_u64().unwrap() as u32;
                if best != want {
                    break;
                }
                let want_lp = step["logprob"].as_f64().unwrap() as f32;
                let got_lp = logprobs[best as usize];
                assert!(
                    (got_lp - want_lp).abs() <= LOGPROB_TOLERANCE,
                    "{name} {:?} step {matched}: logprob {got_lp} vs llama.cpp {want_lp}",
                    case["prompt"]
                );
                matched += 1;
                input = vec![best];
            }
            eprintln!(
                "{name} {:?}: {matched}/{} greedy tokens match",
                case["prompt"],
                steps.len()
            );
            assert!(
                matched >= MIN_MATCHING,
                "{name} {:?}: only {matched} greedy tokens match llama.cpp",
                case["prompt"]
            );
        }
    }
}
