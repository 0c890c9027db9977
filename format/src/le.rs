//! Little-endian field access on byte slices whose bounds the caller has checked, and fixed
//! layouts ([`layout!`]): a structure's fields at their offsets, written once for both
//! directions.

use crate::error::{bail, Result};

/// A value stored little-endian at a fixed offset.
pub(crate) trait Le: Copy {
    fn put(self, b: &mut [u8], at: usize);
    fn get(b: &[u8], at: usize) -> Self;
}

macro_rules! le_ints {
    ($($t:ty),*) => {$(
        impl Le for $t {
            fn put(self, b: &mut [u8], at: usize) {
                b[at..at + size_of::<$t>()].copy_from_slice(&self.to_le_bytes());
            }

            fn get(b: &[u8], at: usize) -> Self {
                <$t>::from_le_bytes(b[at..at + size_of::<$t>()].try_into().expect("sized"))
            }
        }
    )*};
}
le_ints!(u8, u16, u32, u64, i64);

impl Le for [u8; 16] {
    fn put(self, b: &mut [u8], at: usize) {
        b[at..at + 16].copy_from_slice(&self);
    }

    fn get(b: &[u8], at: usize) -> Self {
        b[at..at + 16].try_into().expect("sized")
    }
}

/// Gives `$ty` `$enc(&self) -> [u8; $len]` and `$dec(b) -> Self`: the named fields at their
/// offsets, little-endian. Bytes no field names are written as zero and not read; fields not
/// named are decoded as their `Default`.
macro_rules! layout {
    (
        $ty:ident, $len:expr, $evis:vis $enc:ident, $dvis:vis $dec:ident,
        { $($f:ident @ $at:expr),+ $(,)? }
    ) => {
        impl $ty {
            /// The fixed-width form (no checks).
            $evis fn $enc(&self) -> [u8; $len] {
                let mut b = [0u8; $len];
                $( $crate::le::Le::put(self.$f, &mut b, $at); )+
                b
            }

            /// Decodes the fixed-width form from at least its length in bytes (no checks).
            $dvis fn $dec(b: &[u8]) -> Self {
                let mut v = Self::default();
                $( v.$f = $crate::le::Le::get(b, $at); )+
                v
            }
        }
    };
}
pub(crate) use layout;

pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    Le::get(b, at)
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    Le::get(b, at)
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    Le::get(b, at)
}

pub(crate) fn id_at(b: &[u8], at: usize) -> [u8; 16] {
    Le::get(b, at)
}

/// Rounds `x` up to a multiple of 8.
pub(crate) fn align8(x: u64) -> u64 {
    (x + 7) & !7
}

/// The first `N` little-endian u64 words of `b`.
pub(crate) fn words<const N: usize>(b: &[u8]) -> [u64; N] {
    std::array::from_fn(|i| u64_at(b, 8 * i))
}

/// Appends `words` as little-endian u64s.
pub(crate) fn put_words(out: &mut Vec<u8>, words: &[u64]) {
    out.extend(words.iter().flat_map(|w| w.to_le_bytes()));
}

/// Reads a structure's parts front to back, each checked to be there.
pub(crate) struct Take<'a> {
    /// What is left.
    pub(crate) rest: &'a [u8],
    what: &'static str,
}

impl<'a> Take<'a> {
    pub(crate) fn new(b: &'a [u8], what: &'static str) -> Self {
        Take { rest: b, what }
    }

    /// The next `n` bytes; an error if fewer are left.
    pub(crate) fn bytes(&mut self, n: u64) -> Result<&'a [u8]> {
        let Some(n) = usize::try_from(n).ok().filter(|&n| n <= self.rest.len()) else {
            bail!(self.what, "shorter than its lengths say");
        };
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }

    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64_at(self.bytes(8)?, 0))
    }

    /// The next part preceded by its length (u64).
    pub(crate) fn sized(&mut self) -> Result<&'a [u8]> {
        let n = self.u64()?;
        self.bytes(n)
    }
}
