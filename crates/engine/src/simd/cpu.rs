//! Which kernels run, decided once per process: the CPU's features, capped by the
//! `FERRITE_CPU` environment variable. `portable` and `avx2` make a machine with AVX-512
//! run the code paths of an older one end to end (the tests do, so that every path is
//! checked against llama.cpp on any CI machine), `native` (the default) uses all it has.
//!
//! Also decided once: how far ahead the one-row (decode) kernels ask for weights
//! ([`prefetch_ahead`]), a property of the CPU's memory system rather than its instructions.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The instruction sets the kernels may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// AVX2 with FMA and F16C: the 256-bit kernels.
    pub avx2: bool,
    /// AVX-512F besides: attention's 512-bit kernel.
    pub avx512: bool,
    /// AVX-512 VL, BW and VNNI besides: the wide-tile matrix kernels.
    pub vnni: bool,
    /// AVX-512 BW and BF16 besides AVX-512F: BF16 weights' kernels (`vdpbf16ps`, the
    /// instruction whose rounding llama.cpp's BF16 products have on such a CPU).
    pub bf16: bool,
}

/// The most `FERRITE_CPU` lets the kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    /// Portable Rust only.
    Portable,
    /// At most AVX2.
    Avx2,
    /// Whatever the CPU has.
    Native,
}

/// The variable that caps the kernels.
pub const ENV: &str = "FERRITE_CPU";

impl Cap {
    /// `portable`, `avx2` or `native` (any case).
    pub fn parse(value: &str) -> Result<Self, String> {
        match value.trim().to_ascii_lowercase().as_str() {
            "portable" => Ok(Self::Portable),
            "avx2" => Ok(Self::Avx2),
            "native" | "" => Ok(Self::Native),
            other => Err(format!(
                "{ENV}={other:?}: expected portable, avx2 or native"
            )),
        }
    }

    /// The cap `FERRITE_CPU` asks for (native when unset).
    pub fn from_env() -> Result<Self, String> {
        match std::env::var(ENV) {
            Ok(value) => Self::parse(&value),
            Err(std::env::VarError::NotPresent) => Ok(Self::Native),
            Err(e) => Err(format!("{ENV}: {e}")),
        }
    }
}

impl Features {
    /// What this CPU has.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            let avx512 = avx2 && is_x86_feature_detected!("avx512f");
            let vnni = avx512
                && is_x86_feature_detected!("avx512vnni")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512bw");
            let bf16 = avx512
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512bf16");
            Self {
                avx2,
                avx512,
                vnni,
                bf16,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        Self::NONE
    }

    /// No SIMD at all.
    pub const NONE: Self = Self {
        avx2: false,
        avx512: false,
        vnni: false,
        bf16: false,
    };

    /// These features, at most `cap`.
    pub fn capped(self, cap: Cap) -> Self {
        match cap {
            Cap::Portable => Self::NONE,
            Cap::Avx2 => Self {
                avx512: false,
                vnni: false,
                bf16: false,
                ..self
            },
            Cap::Native => self,
        }
    }

    /// A short name: `avx512-vnni-bf16`, `avx512-vnni`, `avx512`, `avx2` or `portable`
    /// (`-bf16` where the BF16 weights' kernels run).
    pub fn name(self) -> &'static str {
        match (self.avx2, self.avx512, self.vnni) {
            (true, true, true) if self.bf16 => "avx512-vnni-bf16",
            (true, true, true) => "avx512-vnni",
            (true, true, false) => "avx512",
            (true, false, _) => "avx2",
            _ => "portable",
        }
    }
}

/// The features the kernels use, decided on first use: what the CPU has, capped by
/// `FERRITE_CPU` (a value that cannot be read counts as native; `ferrite serve` refuses
/// it before this is first asked).
pub fn features() -> Features {
    static FEATURES: OnceLock<Features> = OnceLock::new();
    *FEATURES.get_or_init(|| {
        let ahead = prefetch_from_env().ok().flatten();
        PREFETCH_AHEAD.store(
            ahead.unwrap_or_else(default_prefetch_ahead),
            Ordering::Relaxed,
        );
        Features::detect().capped(Cap::from_env().unwrap_or(Cap::Native))
    })
}

/// What the CPU has, whatever `FERRITE_CPU` says: the kernel tests compare every path the
/// CPU can run with the portable one.
pub fn detected() -> Features {
    static DETECTED: OnceLock<Features> = OnceLock::new();
    *DETECTED.get_or_init(Features::detect)
}

/// The variable that overrides [`prefetch_ahead`]: bytes, `0` for none.
const PREFETCH_ENV: &str = "FERRITE_PREFETCH_AHEAD";

/// How far ahead of their loads, in bytes, the one-row (decode) kernels ask for weights
/// with software prefetches; 0 for not at all. `FERRITE_PREFETCH_AHEAD` sets it (a value
/// that cannot be read counts as unset; `ferrite serve` refuses it before this is first
/// asked), otherwise [`default_prefetch_ahead`]. Decided with [`features`], which every
/// SIMD kernel's caller has asked first.
///
/// Each kernel reads it once, before its loop, and passes it on as a plain local: read
/// inside the loop (a call to `OnceLock::get_or_init`, or a load of this static) it cost
/// 1B Q4_K_M prefill two fifths of its speed, whatever the distance.
#[inline(always)]
pub fn prefetch_ahead() -> usize {
    PREFETCH_AHEAD.load(Ordering::Relaxed)
}

/// [`prefetch_ahead`]'s value, stored when [`features`] is decided.
static PREFETCH_AHEAD: AtomicUsize = AtomicUsize::new(0);

/// The distance `FERRITE_PREFETCH_AHEAD` asks for (`None` when unset).
pub fn prefetch_from_env() -> Result<Option<usize>, String> {
    match std::env::var(PREFETCH_ENV) {
        Ok(value) => value.trim().parse().map(Some).map_err(|_| {
            format!("{PREFETCH_ENV}={value:?}: expected a number of bytes (0 for none)")
        }),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(e) => Err(format!("{PREFETCH_ENV}: {e}")),
    }
}

/// The prefetch distance for this CPU, where measured: 8 KiB on AMD's Zen 5 (family 1Ah,
/// and the later families, taken to share its memory system), none elsewhere.
///
/// On a Zen 5 the hardware prefetchers alone kept too few lines in flight: a one-row Q6_K
/// product (2 threads, 256 MiB) streamed 29 GB/s and Q4_K 55 where memory gave 70–80, and
/// asking for every line 8 KiB ahead doubled Q6_K and raised the others by a fifth to a
/// half. On a Zen 4 the same prefetches halved Q4_K and Q6_K (82 → 40 and 42 → 25 GMAC/s)
/// and cost every other format 10–20%: its prefetchers keep up with its slower memory, and
/// the extra instructions compete with the loads. Other CPUs were not measured with them,
/// so they keep the kernels as they were tuned there, without.
pub fn default_prefetch_ahead() -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid;
        // SAFETY: CPUID exists on every x86-64 CPU.
        #[allow(unused_unsafe)]
        let (vendor, signature) = unsafe { (__cpuid(0), __cpuid(1)) };
        // "AuthenticAMD" in EBX, EDX, ECX.
        let amd = (vendor.ebx, vendor.edx, vendor.ecx) == (0x6874_7541, 0x6974_6e65, 0x444d_4163);
        let base = (signature.eax >> 8) & 0xf;
        let family = match base {
            0xf => base + ((signature.eax >> 20) & 0xff),
            _ => base,
        };
        if amd && family >= 0x1a {
            return 8192;
        }
    }
    0
}

/// The variable naming a file that `lacks` appends its verdicts to, for the test
/// suite's summary (`scripts/test.sh` prints which kernel tiers ran and which were
/// skipped, since a passing test's own output is not shown).
pub const TIERS_ENV: &str = "FERRITE_KERNEL_TIERS";

/// For a kernel test: whether the CPU lacks `name` (`available` false), saying that the
/// test is skipped. A CPU without it cannot run that kernel; the end-to-end tests under
/// `FERRITE_CPU` cover the paths it can run. Either way the verdict (`ran` or `skipped`,
/// the tier, the test) is appended to the file `FERRITE_KERNEL_TIERS` names.
#[cfg(test)]
pub(crate) fn lacks(available: bool, name: &str) -> bool {
    if !available {
        eprintln!("skipped: this CPU lacks {name}");
    }
    if let Some(path) = std::env::var_os(TIERS_ENV) {
        use std::io::Write;
        let verdict = if available { "ran" } else { "skipped" };
        // One spelling per tier (`AVX-512`, `Avx512` and `avx512` are one).
        let tier = name.to_ascii_uppercase().replace('-', "");
        let test = std::thread::current().name().unwrap_or("?").to_string();
        // One `write` of one line: lines of tests running at once do not interleave.
        let line = format!("{verdict}\t{tier}\t{test}\n");
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = file.write_all(line.as_bytes());
        }
    }
    !available
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_parse_and_only_take_away() {
        assert_eq!(Cap::parse("AVX2"), Ok(Cap::Avx2));
        assert_eq!(Cap::parse(" portable "), Ok(Cap::Portable));
        assert_eq!(Cap::parse("native"), Ok(Cap::Native));
        assert!(Cap::parse("avx512").is_err());
        let all = Features {
            avx2: true,
            avx512: true,
            vnni: true,
            bf16: true,
        };
        assert_eq!(all.capped(Cap::Native), all);
        assert!(!all.capped(Cap::Avx2).bf16);
        assert_eq!(all.capped(Cap::Avx2).name(), "avx2");
        assert_eq!(all.capped(Cap::Portable), Features::NONE);
        assert_eq!(Features::NONE.capped(Cap::Native).name(), "portable");
    }
}
