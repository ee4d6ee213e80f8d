//! The sixteen-row block layouts' tests: every format's VNNI and AVX2 kernels bit for bit
//! against the portable product, on random and extreme values.

use super::*;
use crate::quant::formats::iq4_nl::Iq4Nl;
use crate::quant::formats::{block32, q4_0::Q4_0, q4_1::Q4_1, q5_0::Q5_0, q5_1::Q5_1};
use crate::quant::formats::{q8_0::Q8_0, table4};
use crate::quant::q8::quantize_row;
use crate::quant::sample::{self, Xorshift};
use crate::quant::OwnFormat;
use crate::simd::prefetch::Upcoming;

/// A format's portable product of a weight row with a Q8 activation row.
type Portable = fn(&[u8], &Q8Row) -> f32;

/// Every format against `kernel`'s kernels (`lowest`: the lowest activation it takes),
/// each with its own seed, the matrix's format and its portable kernel (Q4_0's and
/// IQ4_NL's the repacked kernels' arithmetic, see the module).
fn every_format(kernel: Kernel, lowest: i8) {
    let check = assert_matches_the_portable_kernel::<Q8_0>;
    check(21, OwnFormat::Q8_0, block32::dot::<Q8_0>, kernel, lowest);
    let check = assert_matches_the_portable_kernel::<Q4_1>;
    check(22, OwnFormat::Q4_1, block32::dot::<Q4_1>, kernel, lowest);
    let check = assert_matches_the_portable_kernel::<Q5_0>;
    check(23, OwnFormat::Q5_0, block32::dot::<Q5_0>, kernel, lowest);
    let check = assert_matches_the_portable_kernel::<Q4_0>;
    check(
        24,
        OwnFormat::Q4_0_REPACKED,
        block32::dot_repacked::<Q4_0>,
        kernel,
        lowest,
    );
    let check = assert_matches_the_portable_kernel::<Q5_1>;
    check(25, OwnFormat::Q5_1, block32::dot::<Q5_1>, kernel, lowest);
    let check = assert_matches_the_portable_kernel::<Iq4Nl>;
    check(
        26,
        OwnFormat::IQ4_NL_REPACKED,
        table4::dot::<Iq4Nl>,
        kernel,
        lowest,
    );
}

/// `kernel`'s group of sixteen rows against one to four activation rows, given their
/// lane starts; or, `expanded`, the same group decoded once first (Q5_0's).
///
/// # Safety
/// The CPU runs `kernel`; the activations are in its range.
unsafe fn group<L: LaneBlock>(
    kernel: Kernel,
    expanded: bool,
    m: &BlockLanes<L>,
    g: usize,
    a: &[&Q8Row],
    s: &[&[i32]],
) -> Vec<[f32; ROWS]> {
    // SAFETY: as the caller guarantees. Upcoming lines from the group itself: asking
    // for them changes nothing.
    unsafe {
        let soon = Upcoming::new(m.group(0), 3);
        let mut lines = Vec::new();
        match (kernel, expanded) {
            (Kernel::Vnni, false) => by_row_count!(dot_group[L], (m, g), soon, a, s),
            (Kernel::Avx2, false) => by_row_count!(avx2::dot_group[L], (m, g), soon, a, s),
            (Kernel::Vnni, true) => {
                expand_q5_0(m, g, &mut lines);
                by_row_count!(dot_expanded, (&lines, m.blocks), Upcoming::NONE, a, s)
            }
            (Kernel::Avx2, true) => {
                avx2::expand_q5_0(m, g, &mut lines);
                by_row_count!(avx2::dot_expanded, (&lines, m.blocks), Upcoming::NONE, a, s)
            }
        }
    }
}

/// Every row of every group, against one to four activation rows (in every position of
/// a pass), equals the portable dot product `portable` bit for bit, for a matrix of `L`
/// (random blocks of `own`, from `seed`) laid out for `kernel` (Q5_0 also decoded
/// once), the extreme values included: -128 and 127 in Q8_0's weights, the lowest and
/// highest of the others' (IQ4_NL's -127 and 113), 127 and `lowest` in the activations
/// (-128 for a kernel that takes it; the quantizer never makes it). The kernel gets the
/// lane starts only where it takes them, as a chunk passes them (Q5_0's always:
/// decoded once, it needs them too).
fn assert_matches_the_portable_kernel<L: LaneBlock>(
    seed: u64,
    own: &OwnFormat,
    portable: Portable,
    kernel: Kernel,
    lowest: i8,
) {
    let takes_starts = match kernel {
        Kernel::Vnni => starts_taken::<L>(),
        Kernel::Avx2 => avx2::starts_taken::<L>(),
    } > 0;
    let mut rng = Xorshift::new(seed);
    let (rows, cols) = (37, 7 * 32);
    let mut raw = sample::weights(own, rows, cols, &mut rng);
    let (blocks, bytes) = (cols / 32, L::BLOCK_BYTES);
    // Row 3's values all the lowest, row 4's all the highest (Q5_0's fifth bits,
    // bytes 2..6, with its nibbles).
    // Bytes 4.. after a minimum, 2.. otherwise (the fifth bits among them).
    let from = if L::MINIMUMS { 4 } else { 2 };
    let (lowest_weight, highest_weight) = match L::VALUES {
        Values::Bytes => (0x80u8, 0x7f),
        _ => (0x00, 0xff),
    };
    for (r, v) in [(3usize, lowest_weight), (4, highest_weight)] {
        for b in 0..blocks {
            raw[(r * blocks + b) * bytes + from..][..bytes - from].fill(v);
        }
    }
    let m = BlockLanes::<L>::for_kernel(kernel, &raw, rows, cols);
    let mut acts: Vec<Q8Row> = (0..4)
        .map(|_| quantize_row(&sample::activations(1, cols, 4.0, &mut rng)))
        .collect();
    acts[2].qs.fill(lowest);
    acts[3].qs.fill(127);
    let starts: Vec<Vec<i32>> = acts
        .iter()
        .map(|a| match takes_starts {
            true => lane_starts::<L>(a, blocks),
            false => Vec::new(),
        })
        .collect();
    let row_bytes = blocks * bytes;
    for g in 0..rows.div_ceil(ROWS) {
        for (first, end) in [(0, 4), (1, 2), (0, 3), (2, 4), (3, 4), (0, 1)] {
            let a: Vec<&Q8Row> = acts[first..end].iter().collect();
            let s: Vec<&[i32]> = starts[first..end].iter().map(Vec::as_slice).collect();
            // SAFETY: the test checked the CPU; the activations are in range.
            let got = unsafe { group(kernel, false, &m, g, &a, &s) };
            let mut results = vec![("", got)];
            if expands::<L>() {
                // SAFETY: as above.
                let got = unsafe { group(kernel, true, &m, g, &a, &s) };
                results.push((", decoded once", got));
            }
            for (how, got) in results {
                for (got, t) in got.iter().zip(first..end) {
                    for (lane, got) in got.iter().enumerate() {
                        let r = g * ROWS + lane;
                        let w = || &raw[r * row_bytes..][..row_bytes];
                        let want = match r < rows {
                            true => portable(w(), &acts[t]),
                            false => 0.0,
                        };
                        assert_eq!(
                            want.to_bits(),
                            got.to_bits(),
                            "{} row {r}, act {t} of {first}..{end}{how}",
                            L::NAME
                        );
                    }
                }
            }
        }
    }
}

/// The AVX-512 VNNI kernels.
#[test]
fn vnni_kernels_are_bit_identical_to_the_portable_ones() {
    // Whatever FERRITE_CPU says: this compares the kernel the CPU can run.
    if crate::simd::cpu::lacks(crate::simd::cpu::detected().vnni, "vnni") {
        return;
    }
    every_format(Kernel::Vnni, -128);
}

/// The AVX2 kernels.
#[test]
fn avx2_kernels_are_bit_identical_to_the_portable_ones() {
    if crate::simd::cpu::lacks(crate::simd::cpu::detected().avx2, "avx2") {
        return;
    }
    every_format(Kernel::Avx2, -127);
}
