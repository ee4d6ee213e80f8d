//! libFuzzer target: any bytes as the body of `POST /v1/completions`, parsed and
//! validated with and without `--ignore-unknown-fields`. Every input must give
//! parameters or a 4xx error whose body serializes; a panic or a crash is a finding.
//! Seeds: `corpus/request/` (requests using every kind of field).
//!
//!     cargo fuzz run --fuzz-dir libfuzzer --sanitizer none request WORK_DIR libfuzzer/corpus/request -- -max_total_time=600

#![no_main]

use ferrite_server::validate::{parse_body, FieldLimits, GenerateParams};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    for ignore_unknown in [false, true] {
        if let Err(e) = parse_body(data, ignore_unknown)
            .and_then(|r| GenerateParams::new(r, &FieldLimits::DEFAULT)) {
            let body = serde_json::to_string(&e.body()).expect("error bodies serialize");
            assert!(body.contains("\"message\""));
            assert!(e.status().is_client_error(), "{e:?}");
        }
    }
});
