//! The AVX2 and AVX-512 kernels of `panels.rs`, written once over [`Lanes`]: a panel's two
//! vectors of weights widened once per input and shared by the group's rows, each row's
//! input broadcast, each output's chain of fused multiply-adds in input order (the
//! portable kernel's operations, so its bits).

use half::f16;

use super::{Job, GROUP};
use crate::simd::lanes::{Avx2, Avx512, Lanes};

/// [`Job`] with AVX2.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn avx2(job: Job<'_>) {
    // SAFETY: the caller upholds this function's contract, all `run` needs.
    unsafe { run::<Avx2>(job) }
}

/// [`Job`] with AVX-512.
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and AVX-512F.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub(super) unsafe fn avx512(job: Job<'_>) {
    // SAFETY: the caller upholds this function's contract, all `run` needs.
    unsafe { run::<Avx512>(job) }
}

/// Checks the job's lengths against a panel of two `L` vectors, then runs the kernel of
/// its group's size.
///
/// # Safety
/// The CPU has `L`'s instructions ([`Lanes`]).
#[inline(always)]
unsafe fn run<L: Lanes>(job: Job<'_>) {
    let width = 2 * L::WIDTH;
    let inputs = job.x[0].len();
    assert!((1..=GROUP).contains(&job.rows));
    assert!(job.x.iter().all(|x| x.len() == inputs));
    assert_eq!(job.panel.len(), inputs * width);
    assert!(job.acc.len() >= job.rows * width);
    let (panel, acc) = (job.panel.as_ptr(), job.acc.as_mut_ptr());
    let x = job.x.map(<[f32]>::as_ptr);
    // SAFETY: the CPU has L's instructions (the caller's contract); the lengths were
    // checked above, as `group` needs them.
    unsafe {
        match job.rows {
            6 => group::<L, 6>(panel, x, inputs, acc),
            5 => group::<L, 5>(panel, x, inputs, acc),
            4 => group::<L, 4>(panel, x, inputs, acc),
            3 => group::<L, 3>(panel, x, inputs, acc),
            2 => group::<L, 2>(panel, x, inputs, acc),
            _ => group::<L, 1>(panel, x, inputs, acc),
        }
    }
}

/// `R` rows' accumulators (`acc`, two vectors per row) plus the panel's `inputs` inputs
/// (two vectors of F16 weights per input) times each row's inputs (`x[r]`).
///
/// # Safety
/// The CPU has `L`'s instructions; `panel` holds `inputs * 2 * L::WIDTH` values, each of
/// the first `R` of `x` holds `inputs` values, `acc` holds `R * 2 * L::WIDTH` writable
/// values.
#[inline(always)]
unsafe fn group<L: Lanes, const R: usize>(
    panel: *const f16,
    x: [*const f32; GROUP],
    inputs: usize,
    acc: *mut f32,
) {
    // SAFETY: the caller upholds this function's contract; every load and store is of a
    // whole vector inside `panel`'s input `k` or row `r`'s accumulators, and every
    // scalar read is `x[r][k]` with `k < inputs`.
    unsafe {
        let (w, width) = (L::WIDTH, 2 * L::WIDTH);
        let mut a: [[L::V; 2]; R] =
            std::array::from_fn(|r| [L::load(acc.add(r * width)), L::load(acc.add(r * width + w))]);
        for k in 0..inputs {
            let p = panel.add(k * width);
            let (w0, w1) = (L::load_f16(p), L::load_f16(p.add(w)));
            for (a, x) in a.iter_mut().zip(&x) {
                let xv = L::splat(*x.add(k));
                a[0] = L::fmadd(w0, xv, a[0]);
                a[1] = L::fmadd(w1, xv, a[1]);
            }
        }
        for (r, a) in a.iter().enumerate() {
            L::store(acc.add(r * width), a[0]);
            L::store(acc.add(r * width + w), a[1]);
        }
    }
}
