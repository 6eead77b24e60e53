//! FNV-1a, 64-bit: the one hash the host and guests share. It is stable across builds,
//! platforms and runs (std's hashers are not), and it is the hash the API server's sharded
//! lists and watches use, so the host shards by it too.
//!
//! ```
//! assert_eq!(wasmop_contract::hash::fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
//! ```

const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a, 64-bit, of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(OFFSET, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
