//! NAS Parallel Benchmarks for kumo's guest: the parts that do not depend on the guest
//! runtime (problem classes, the random generator, each kernel's per-thread work,
//! deterministic combining, verification, Mop/s).
//!
//! `no_std` and allocation-free: the same code runs in the guest's ring 3 and in the
//! host's unit tests, and both use the pure-Rust `libm`, so they compute the same bits.
#![no_std]
#![deny(clippy::undocumented_unsafe_blocks)]

use core::fmt;
use core::str::FromStr;

pub mod bt;
pub mod cfd;
pub mod cg;
pub mod ep;
pub mod ft;
#[cfg(target_arch = "x86_64")]
pub mod green;
#[cfg(any(test, feature = "host"))]
pub mod host;
pub mod is;
pub mod lu;
pub mod mg;
pub mod mpi;
pub mod random;
pub mod sp;
pub mod team;
#[cfg(test)]
mod testing;

use team::{Arena, Team};

/// A benchmark kernel. Each has its own module with per-thread work, combine and
/// verify, and a row in the `match`es below.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum Kernel {
    Ep,
    Mg,
    Is,
    Cg,
    Ft,
    Sp,
    Bt,
    Lu,
}

impl Kernel {
    pub const ALL: &'static [Kernel] = &[
        Kernel::Ep,
        Kernel::Mg,
        Kernel::Is,
        Kernel::Cg,
        Kernel::Ft,
        Kernel::Sp,
        Kernel::Bt,
        Kernel::Lu,
    ];

    /// Lower-case name as written on command lines and in results: `ep`.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Ep => "ep",
            Kernel::Mg => "mg",
            Kernel::Is => "is",
            Kernel::Cg => "cg",
            Kernel::Ft => "ft",
            Kernel::Sp => "sp",
            Kernel::Bt => "bt",
            Kernel::Lu => "lu",
        }
    }

    fn from_name(name: &str) -> Option<Kernel> {
        Kernel::ALL.iter().copied().find(|k| k.name() == name)
    }

    /// The classes this kernel has here: every kernel and pseudo-application has S to C.
    pub fn classes(self) -> &'static [Class] {
        match self {
            Kernel::Sp
            | Kernel::Bt
            | Kernel::Lu
            | Kernel::Ep
            | Kernel::Mg
            | Kernel::Is
            | Kernel::Cg
            | Kernel::Ft => Class::ALL,
        }
    }

    /// Whether this kernel has `class` ([`Spec`] parsing refuses the others).
    pub fn has(self, class: Class) -> bool {
        self.classes().contains(&class)
    }
}

/// For a kernel's per-class tables at a class it lacks: unreachable through [`Spec`]
/// parsing, which refuses such a pair. (Every benchmark here has every class today;
/// kept for one being added with fewer.)
#[allow(dead_code)]
pub(crate) fn lacks(kernel: Kernel, class: Class) -> ! {
    panic!(
        "{} has no class {} (Spec parsing refuses it)",
        kernel.name(),
        class.letter()
    )
}

/// A problem size class (not every kernel has every class: [`Kernel::classes`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum Class {
    S,
    W,
    A,
    B,
    C,
}

impl Class {
    pub const ALL: &'static [Class] = &[Class::S, Class::W, Class::A, Class::B, Class::C];

    /// Upper-case letter: `S`.
    pub fn letter(self) -> char {
        match self {
            Class::S => 'S',
            Class::W => 'W',
            Class::A => 'A',
            Class::B => 'B',
            Class::C => 'C',
        }
    }

    fn from_text(text: &str) -> Option<Class> {
        let mut chars = text.chars();
        let letter = chars.next()?;
        if chars.next().is_some() {
            return None;
        }
        Class::ALL.iter().copied().find(|c| c.letter() == letter)
    }
}

/// One benchmark run: kernel and class, written `ep.S`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub struct Spec {
    pub kernel: Kernel,
    pub class: Class,
}

impl Spec {
    /// What the guest runs when the command line names no benchmarks: every kernel, class S.
    pub fn defaults() -> impl Iterator<Item = Spec> {
        Kernel::ALL.iter().map(|&kernel| Spec {
            kernel,
            class: Class::S,
        })
    }
}

impl fmt::Display for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.kernel.name(), self.class.letter())
    }
}

impl FromStr for Spec {
    type Err = ParseSpecError;

    fn from_str(item: &str) -> Result<Spec, ParseSpecError> {
        let Some((kernel, class)) = item.split_once('.') else {
            return Err(ParseSpecError::Malformed {
                item: Text::new(item),
            });
        };
        let Some(kernel) = Kernel::from_name(kernel) else {
            return Err(ParseSpecError::UnknownBenchmark {
                item: Text::new(item),
                name: Text::new(kernel),
            });
        };
        let Some(class) = Class::from_text(class) else {
            return Err(ParseSpecError::UnknownClass {
                item: Text::new(item),
                class: Text::new(class),
            });
        };
        if !kernel.has(class) {
            return Err(ParseSpecError::MissingClass {
                item: Text::new(item),
                kernel,
                class,
            });
        }
        Ok(Spec { kernel, class })
    }
}

/// Why a benchmark item such as `ep.S` did not parse. Holds copies of the offending text
/// (no allocator in the guest; very long text is cut at [`Text::CAPACITY`] bytes).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ParseSpecError {
    /// Not `kernel.class`.
    Malformed { item: Text },
    /// The part before the dot names no kernel.
    UnknownBenchmark { item: Text, name: Text },
    /// The part after the dot names no class.
    UnknownClass { item: Text, class: Text },
    /// The kernel lacks the class.
    MissingClass {
        item: Text,
        kernel: Kernel,
        class: Class,
    },
}

impl ParseSpecError {
    /// A short machine-readable kind, used as `what=` in `@kumo error` lines.
    pub fn kind(&self) -> &'static str {
        match self {
            ParseSpecError::Malformed { .. } => "malformed-benchmark",
            ParseSpecError::UnknownBenchmark { .. } => "unknown-benchmark",
            ParseSpecError::UnknownClass { .. } => "unknown-class",
            ParseSpecError::MissingClass { .. } => "missing-class",
        }
    }

    /// The whole item that failed to parse.
    pub fn item(&self) -> &str {
        match self {
            ParseSpecError::Malformed { item }
            | ParseSpecError::UnknownBenchmark { item, .. }
            | ParseSpecError::UnknownClass { item, .. }
            | ParseSpecError::MissingClass { item, .. } => item.as_str(),
        }
    }
}

impl fmt::Display for ParseSpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseSpecError::Malformed { item } => {
                write!(
                    f,
                    "'{}' is not of the form kernel.class (e.g. ep.S)",
                    item.as_str()
                )
            }
            ParseSpecError::UnknownBenchmark { item, name } => {
                write!(
                    f,
                    "unknown benchmark '{}' in '{}' (known: ",
                    name.as_str(),
                    item.as_str()
                )?;
                for (i, kernel) in Kernel::ALL.iter().enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    write!(f, "{sep}{}", kernel.name())?;
                }
                f.write_str(")")
            }
            ParseSpecError::UnknownClass { item, class } => {
                write!(
                    f,
                    "unknown class '{}' in '{}' (known: ",
                    class.as_str(),
                    item.as_str()
                )?;
                for (i, c) in Class::ALL.iter().enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    write!(f, "{sep}{}", c.letter())?;
                }
                f.write_str(")")
            }
            ParseSpecError::MissingClass {
                item,
                kernel,
                class,
            } => {
                write!(
                    f,
                    "{} has no class {} in '{}' (it has ",
                    kernel.name(),
                    class.letter(),
                    item.as_str()
                )?;
                for (i, c) in kernel.classes().iter().enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    write!(f, "{sep}{}", c.letter())?;
                }
                f.write_str(")")
            }
        }
    }
}

/// A short string stored inline (error reports without an allocator).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Text {
    bytes: [u8; Text::CAPACITY],
    len: u8,
}

impl Text {
    pub const CAPACITY: usize = 64;

    /// Copies `s`, cut to at most `CAPACITY` bytes on a character boundary.
    pub fn new(s: &str) -> Text {
        let mut len = s.len().min(Text::CAPACITY);
        while !s.is_char_boundary(len) {
            len -= 1;
        }
        let mut bytes = [0; Text::CAPACITY];
        bytes[..len].copy_from_slice(&s.as_bytes()[..len]);
        Text {
            bytes,
            len: len as u8,
        }
    }

    pub fn as_str(&self) -> &str {
        // Built from a &str cut on a character boundary, so always valid UTF-8.
        core::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }
}

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// Arena bytes the workload needs with `threads` threads. The runtimes check this
/// before forking (the guest prints `@kumo error what=out-of-memory`) and kumo sizes
/// guest memory from it.
pub fn workload_heap_bytes(spec: Spec, threads: u32) -> u64 {
    let threads = threads.max(1) as usize;
    (match spec.kernel {
        Kernel::Ep => ep::heap_bytes(threads),
        Kernel::Mg => mg::heap_bytes(spec.class, threads),
        Kernel::Is => is::heap_bytes(spec.class, threads),
        Kernel::Cg => cg::heap_bytes(spec.class, threads),
        Kernel::Ft => ft::heap_bytes(spec.class, threads),
        Kernel::Sp => sp::heap_bytes(spec.class, threads),
        Kernel::Bt => bt::heap_bytes(spec.class, threads),
        Kernel::Lu => lu::heap_bytes(spec.class, threads),
    }) as u64
}

/// Runs this thread's part of `spec`. Every thread of the team calls it with an arena
/// over the same memory of at least [`workload_heap_bytes`]; the master's outcome is
/// the run's (the others' may be partial).
pub fn run(spec: Spec, team: &Team, arena: &mut Arena) -> Outcome {
    match spec.kernel {
        Kernel::Ep => ep::run(spec.class, team, arena),
        Kernel::Mg => mg::run(spec.class, team, arena),
        Kernel::Is => is::run(spec.class, team, arena),
        Kernel::Cg => cg::run(spec.class, team, arena),
        Kernel::Ft => ft::run(spec.class, team, arena),
        Kernel::Sp => sp::run(spec.class, team, arena),
        Kernel::Bt => bt::run(spec.class, team, arena),
        Kernel::Lu => lu::run(spec.class, team, arena),
    }
}

/// What a run reports: the time of the region NPB times, the rate by NPB's formula,
/// the verdict against every official value, and the values worth printing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outcome {
    pub seconds: f64,
    pub mops: f64,
    pub verified: bool,
    pub values: Values,
}

/// Named result values printed beside the verdict (`zeta=17.13...`): a few, inline,
/// since the guest has no allocator.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Values {
    items: [(&'static str, f64); Values::CAPACITY],
    len: usize,
}

impl Values {
    pub const CAPACITY: usize = 16;

    pub const fn new() -> Values {
        Values {
            items: [("", 0.0); Values::CAPACITY],
            len: 0,
        }
    }

    /// Adds `key=value`; keys are lower-case words. Beyond capacity, values are
    /// dropped (a kernel bug caught by its tests, never a crash).
    pub fn push(&mut self, key: &'static str, value: f64) {
        if self.len < Values::CAPACITY {
            self.items[self.len] = (key, value);
            self.len += 1;
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&'static str, f64)> + '_ {
        self.items[..self.len].iter().copied()
    }
}

impl Default for Values {
    fn default() -> Self {
        Values::new()
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::string::ToString;

    use super::*;

    #[test]
    fn parses_and_prints_every_spec() {
        for &kernel in Kernel::ALL {
            for &class in Class::ALL {
                let spec = Spec { kernel, class };
                let text = spec.to_string();
                if kernel.has(class) {
                    assert_eq!(text.parse::<Spec>(), Ok(spec));
                } else {
                    assert_eq!(text.parse::<Spec>().unwrap_err().kind(), "missing-class");
                }
            }
        }
        assert!(Kernel::Sp.has(Class::C) && Kernel::Bt.has(Class::B) && Kernel::Lu.has(Class::C));
        assert!(Kernel::Ep.has(Class::B) && Kernel::Ft.has(Class::C));
        assert_eq!(
            "ep.S".parse(),
            Ok(Spec {
                kernel: Kernel::Ep,
                class: Class::S
            })
        );
        assert_eq!(
            "ep.A".parse(),
            Ok(Spec {
                kernel: Kernel::Ep,
                class: Class::A
            })
        );
        assert_eq!(
            Spec {
                kernel: Kernel::Ep,
                class: Class::W
            }
            .to_string(),
            "ep.W"
        );
    }

    #[test]
    fn rejects_bad_specs_with_useful_messages() {
        let err = "xx.S".parse::<Spec>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown benchmark 'xx' in 'xx.S' (known: ep, mg, is, cg, ft, sp, bt, lu)"
        );
        assert_eq!((err.kind(), err.item()), ("unknown-benchmark", "xx.S"));

        let err = "ep.Q".parse::<Spec>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown class 'Q' in 'ep.Q' (known: S, W, A, B, C)"
        );
        assert_eq!((err.kind(), err.item()), ("unknown-class", "ep.Q"));

        assert_eq!("ft.B".parse::<Spec>().map(|s| s.class), Ok(Class::B));
        assert_eq!(
            "ft.D".parse::<Spec>().unwrap_err().kind(),
            "unknown-class",
            "NPB's class D is not here"
        );

        let err = "ep".parse::<Spec>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "'ep' is not of the form kernel.class (e.g. ep.S)"
        );
        assert_eq!(err.kind(), "malformed-benchmark");

        // Case matters: kernels lower-case, classes upper-case.
        assert_eq!(
            "EP.S".parse::<Spec>().unwrap_err().kind(),
            "unknown-benchmark"
        );
        assert_eq!("ep.s".parse::<Spec>().unwrap_err().kind(), "unknown-class");
        assert_eq!("ep.SW".parse::<Spec>().unwrap_err().kind(), "unknown-class");
        assert_eq!("ep.".parse::<Spec>().unwrap_err().kind(), "unknown-class");
        assert_eq!(
            "".parse::<Spec>().unwrap_err().kind(),
            "malformed-benchmark"
        );
        assert_eq!(
            ".S".parse::<Spec>().unwrap_err().kind(),
            "unknown-benchmark"
        );
    }

    #[test]
    fn long_and_multibyte_items_are_cut_safely() {
        let long = "é".repeat(100) + ".S";
        let err = long.parse::<Spec>().unwrap_err();
        assert_eq!(err.item().len(), Text::CAPACITY);
        assert!(long.starts_with(err.item()));
        let odd = "x".repeat(63) + "é";
        assert_eq!(Text::new(&odd).as_str(), "x".repeat(63));
    }

    #[test]
    fn names_and_letters() {
        assert_eq!(Kernel::Ep.name(), "ep");
        let letters: std::string::String = Class::ALL.iter().map(|c| c.letter()).collect();
        assert_eq!(letters, "SWABC");
        assert_eq!(Spec::defaults().count(), Kernel::ALL.len());
        assert!(Spec::defaults().all(|s| s.class == Class::S));
    }

    /// Runs every kernel at `class` on `threads` host threads; each must verify.
    fn every_kernel(class: Class, threads: usize) -> std::vec::Vec<Outcome> {
        Kernel::ALL
            .iter()
            .map(|&kernel| {
                let outcome = host::run(Spec { kernel, class }, threads);
                assert!(
                    outcome.verified && outcome.seconds > 0.0 && outcome.mops > 0.0,
                    "{}.{} on {threads} threads: {outcome:?}",
                    kernel.name(),
                    class.letter()
                );
                outcome
            })
            .collect()
    }

    #[test]
    fn every_kernel_class_s_verifies_on_one_to_eight_threads() {
        // 3, 5 and 7 divide no kernel's sizes: the splits must still verify.
        for threads in 1..=8 {
            every_kernel(Class::S, threads);
        }
    }

    #[test]
    fn the_same_thread_count_gives_the_same_bits() {
        let bits = |outcomes: std::vec::Vec<Outcome>| -> std::vec::Vec<u64> {
            outcomes
                .iter()
                .flat_map(|o| o.values.iter().map(|(_, v)| v.to_bits()))
                .collect()
        };
        assert_eq!(
            bits(every_kernel(Class::S, 3)),
            bits(every_kernel(Class::S, 3))
        );
    }

    #[test]
    #[ignore = "25 s in a debug build; class S on 1-8 threads stays in the default run: .ci/run runs it with --include-ignored"]
    fn every_kernel_class_w_verifies_on_two_threads() {
        every_kernel(Class::W, 2);
    }

    #[test]
    #[ignore = "class A: seconds per kernel and up to ~450 MiB; run with --release --include-ignored"]
    fn every_kernel_class_a_verifies_on_two_threads() {
        every_kernel(Class::A, 2);
    }

    #[test]
    fn every_kernel_runs_in_exactly_its_heap_with_little_to_spare() {
        // The arena panics if a kernel allocates more than workload_heap_bytes.
        for &kernel in Kernel::ALL {
            for threads in [1, 3] {
                let spec = Spec {
                    kernel,
                    class: Class::S,
                };
                let bytes = workload_heap_bytes(spec, threads as u32) as usize;
                let used = crate::testing::on_team(threads, bytes, |team, arena| {
                    let outcome = run(spec, team, arena);
                    // Only the master's outcome is the run's.
                    assert!(!team.is_master() || outcome.verified, "{outcome:?}");
                    arena.used()
                });
                assert!(
                    used <= bytes && bytes - used < 1024,
                    "{spec}: {used} of {bytes}"
                );
            }
        }
    }

    #[test]
    fn heap_grows_with_threads() {
        let spec = Spec {
            kernel: Kernel::Ep,
            class: Class::S,
        };
        let one = workload_heap_bytes(spec, 1);
        assert!(one >= 1 << 20);
        assert!(workload_heap_bytes(spec, 4) >= 4 * (1 << 20));
    }
}
