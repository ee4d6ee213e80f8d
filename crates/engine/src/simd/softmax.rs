//! The online softmax of ggml's flash attention, a block of keys at a time: each key's
//! step (whether its score raised the row's running maximum, the factor what came before
//! is rescaled by, and its weight), and the rows' sums of weights moved past a block.
//! Every attention kernel, f16 or quantized cache, takes its steps from here: one key at a
//! time in portable code ([`online_step`]), a vector of keys at a time where AVX2 runs
//! ([`KeySteps::fill`], glibc's `expf` on the lanes), the same bits either way.

#[cfg(target_arch = "x86_64")]
use super::lanes::Lanes;

/// Keys whose steps one [`KeySteps`] holds: one KV cache block's positions.
pub const STEP_KEYS: usize = 64;

// [`KeySteps::raised`] holds a bit per key, and [`KeySteps::fill`] takes whole vectors.
const _: () = assert!(STEP_KEYS <= 64 && STEP_KEYS.is_multiple_of(16));

/// One key's step of a row's online softmax, as ggml's flash attention takes it: a score
/// `s` greater than the running maximum raises it (a NaN never does), weighs 1 and
/// rescales what came before by `expf(old maximum − s)`; any other weighs
/// `expf(s − maximum)` and rescales by 1. Returns (rescale, weight, raised).
pub fn online_step(s: f32, max: &mut f32) -> (f32, f32, bool) {
    if s > *max {
        let rescale = (*max - s).exp();
        *max = s;
        (rescale, 1.0, true)
    } else {
        (1.0, (s - *max).exp(), false)
    }
}

/// One query row's steps of its online softmax over up to [`STEP_KEYS`] keys.
pub struct KeySteps {
    /// Per key, the factor the accumulator is rescaled by (1 unless the key raised the
    /// maximum).
    pub rescale: [f32; STEP_KEYS],
    /// Per key, the weight of its value.
    pub weight: [f32; STEP_KEYS],
    /// Bit j set where key j raised the maximum, rescaling the accumulator.
    pub raised: u64,
}

impl KeySteps {
    /// Steps that nothing has filled yet.
    pub const EMPTY: Self = Self {
        rescale: [1.0; STEP_KEYS],
        weight: [0.0; STEP_KEYS],
        raised: 0,
    };

    /// Whether key `j` raised the maximum (then what came before is rescaled by
    /// `rescale[j]`).
    #[inline(always)]
    pub fn raised(&self, j: usize) -> bool {
        self.raised >> j & 1 != 0
    }

    /// Fills the steps of the first `len` keys from their scores (already scaled, and
    /// capped where the model caps them), and moves the running maximum past them: with
    /// AVX2 where it runs, else one key at a time; the same bits. Lanes of `scaled` past
    /// `len` must score -∞ (as `ScoreScale::scaled_block` leaves them): a vector of keys
    /// reads to the end of its last vector, where they raise nothing and their steps go
    /// unread.
    pub fn fill_scaled(&mut self, scaled: &[f32; STEP_KEYS], len: usize, max: &mut f32) {
        assert!(len <= STEP_KEYS);
        #[cfg(target_arch = "x86_64")]
        if super::avx2() {
            let read = len
                .next_multiple_of(super::lanes::Avx2::WIDTH)
                .min(STEP_KEYS);
            assert!(scaled[len..read].iter().all(|&s| s == f32::NEG_INFINITY));
            // SAFETY: the AVX2 kernels' feature set is available; `len` ≤ STEP_KEYS.
            unsafe { fill_avx2(self, scaled, len, max) };
            return;
        }
        self.fill_portable(&scaled[..len], max);
    }

    /// [`Self::fill_scaled`] one key at a time ([`online_step`]).
    pub fn fill_portable(&mut self, scaled: &[f32], max: &mut f32) {
        self.raised = 0;
        for (j, &s) in scaled.iter().enumerate() {
            let (rescale, weight, raised) = online_step(s, max);
            self.rescale[j] = rescale;
            self.weight[j] = weight;
            self.raised |= u64::from(raised) << j;
        }
    }

    /// [`Self::fill_scaled`] a vector of keys at a time ([`Lanes::softmax_steps`]), where
    /// every lane of `scaled` from `len` to the end of its vector is -∞.
    ///
    /// # Safety
    /// The CPU has `L`'s instructions ([`Lanes`]); `len` is at most [`STEP_KEYS`].
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(crate) unsafe fn fill<L: Lanes>(
        &mut self,
        scaled: &[f32; STEP_KEYS],
        len: usize,
        max: &mut f32,
    ) {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need; every vector read lies within `scaled` and the steps
        // (`STEP_KEYS` is a multiple of both widths).
        unsafe {
            self.raised = 0;
            for j in (0..len).step_by(L::WIDTH) {
                let steps = L::softmax_steps(L::load(scaled.as_ptr().add(j)), *max);
                L::store(self.rescale.as_mut_ptr().add(j), steps.rescale);
                L::store(self.weight.as_mut_ptr().add(j), steps.weight);
                self.raised |= u64::from(steps.raised) << j;
                *max = steps.max;
            }
        }
    }
}

/// [`KeySteps::fill`] with AVX2.
///
/// # Safety
/// AVX2, FMA and F16C are available; as for [`KeySteps::fill`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fill_avx2(steps: &mut KeySteps, scaled: &[f32; STEP_KEYS], len: usize, max: &mut f32) {
    // SAFETY: the caller upholds this function's safety contract.
    unsafe { steps.fill::<super::lanes::Avx2>(scaled, len, max) }
}

/// Moves `R` rows' sums of weights (`sums`) past the block's `len` keys: key by key, in
/// order, each rescaled and then added. The rows' chains are independent and held in
/// registers, so that each row's step overlaps the others' (one chain alone waits on
/// every multiply-add before it).
#[inline(always)]
fn add_to_sums_of<const R: usize>(sums: &mut [f32], steps: &[KeySteps], len: usize) {
    let steps: &[KeySteps; R] = steps[..R].try_into().unwrap();
    let mut s: [f32; R] = sums[..R].try_into().unwrap();
    for j in 0..len {
        for (s, steps) in s.iter_mut().zip(steps) {
            *s = s.mul_add(steps.rescale[j], steps.weight[j]);
        }
    }
    sums[..R].copy_from_slice(&s);
}

/// [`add_to_sums_of`] for every row of `steps`, four at a time.
pub fn add_to_sums(sums: &mut [f32], steps: &[KeySteps], len: usize) {
    assert_eq!(sums.len(), steps.len());
    for g in (0..steps.len()).step_by(4) {
        let (sums, steps) = (&mut sums[g..], &steps[g..]);
        match steps.len() {
            1 => add_to_sums_of::<1>(sums, steps, len),
            2 => add_to_sums_of::<2>(sums, steps, len),
            3 => add_to_sums_of::<3>(sums, steps, len),
            _ => add_to_sums_of::<4>(sums, steps, len),
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::quant::sample::Xorshift;

    /// [`KeySteps::fill`] with AVX-512.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA, F16C and AVX-512 F; as for [`KeySteps::fill`].
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    unsafe fn fill_avx512(
        steps: &mut KeySteps,
        scaled: &[f32; STEP_KEYS],
        len: usize,
        max: &mut f32,
    ) {
        // SAFETY: the caller upholds this function's safety contract.
        unsafe { steps.fill::<super::super::lanes::Avx512>(scaled, len, max) }
    }

    /// Score runs that test the order of the running maximum: ties (the earlier of equal
    /// scores stays, `+0` after `-0` raises nothing), NaN (raises nothing, weighs NaN),
    /// -∞, gaps past `expf`'s underflow, rises and falls at every lane.
    fn hostile_runs() -> Vec<Vec<f32>> {
        let mut rng = Xorshift::new(7);
        let mut runs = vec![
            vec![-0.0, 0.0, -0.0, 0.0, 1.0, 1.0, -1.0, 1.0],
            vec![-0.0, 0.0, -0.0, 0.0],
            vec![0.0, -0.0, 0.0, -0.0, 0.0, 0.0, 0.0, 0.0, -0.0],
            vec![f32::NAN, 1.0, f32::NAN, 2.0, f32::NAN],
            vec![f32::NEG_INFINITY, f32::NEG_INFINITY, 3.0, f32::NEG_INFINITY],
            vec![f32::NAN; 3],
            vec![
                -500.0, 0.0, 500.0, -104.0, 103.5, 88.5, -88.5, 0.0, 1e30, -1e30,
            ],
            (0..64).map(|i| i as f32).collect(),
            (0..64).map(|i| -(i as f32)).collect(),
            (0..64)
                .map(|i| if i % 2 == 0 { i as f32 } else { -(i as f32) })
                .collect(),
        ];
        for len in [1, 7, 8, 9, 15, 16, 17, 33, 63, 64] {
            runs.push((0..len).map(|_| (rng.next_f32() - 0.5) * 200.0).collect());
        }
        runs
    }

    /// Both widths, and the dispatched fill, give the steps one key at a time gives.
    #[test]
    fn vector_steps_match_the_scalar_ones() {
        type Fill = unsafe fn(&mut KeySteps, &[f32; STEP_KEYS], usize, &mut f32);
        let cpu = crate::simd::cpu::detected();
        let widths: [(&str, bool, Fill); 2] = [
            ("AVX2", cpu.avx2, fill_avx2),
            ("AVX-512", cpu.avx512, fill_avx512),
        ];
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        for (name, usable, fill) in widths {
            if crate::simd::cpu::lacks(usable, name) {
                continue;
            }
            for run in hostile_runs() {
                for start in [f32::NEG_INFINITY, 0.0, -0.0, 5.0] {
                    let mut scaled = [f32::NEG_INFINITY; STEP_KEYS];
                    scaled[..run.len()].copy_from_slice(&run);
                    let (mut want, mut want_max) = (KeySteps::EMPTY, start);
                    want.fill_portable(&run, &mut want_max);
                    let (mut steps, mut max) = (KeySteps::EMPTY, start);
                    // SAFETY: the CPU has the width's features.
                    unsafe { fill(&mut steps, &scaled, run.len(), &mut max) };
                    let (mut dispatched, mut dispatched_max) = (KeySteps::EMPTY, start);
                    dispatched.fill_scaled(&scaled, run.len(), &mut dispatched_max);
                    for (steps, max) in [(&steps, max), (&dispatched, dispatched_max)] {
                        assert!(
                            same(max, want_max),
                            "{name}: max {max} against {want_max} for {run:?}"
                        );
                        assert_eq!(steps.raised, want.raised, "{name}: {run:?} from {start}");
                        for j in 0..run.len() {
                            assert!(
                                same(steps.rescale[j], want.rescale[j])
                                    && same(steps.weight[j], want.weight[j]),
                                "{name}: key {j} of {run:?} from {start}"
                            );
                        }
                    }
                }
            }
        }
    }
}
