//! Redis key names: `prefix:name:key`, bounded whatever the key.
//!
//! A key of 1 to 64 printable ASCII bytes (no space, no `{`, `}` and not
//! starting with `#`) is kept as it is, so keys stay readable in
//! `redis-cli`. Any other key (long, binary, or with braces, which Redis
//! Cluster would read as a hash tag) becomes `#` and 32 hex digits: the
//! first 128 bits of its SHA-1. So a 1 MB header value costs a 36-byte key
//! part, and a caller cannot pick another key's Cluster slot.

use super::RedisError;

/// The longest key kept readable.
pub(crate) const MAX_READABLE: usize = 64;

/// Whether `name` may be a prefix or a policy name: 1 to 64 printable ASCII
/// bytes, without space, `:` or braces.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_READABLE
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}' && b != b':')
}

fn readable(key: &[u8]) -> bool {
    !key.is_empty()
        && key.len() <= MAX_READABLE
        && key[0] != b'#'
        && key
            .iter()
            .all(|&b| b.is_ascii_graphic() && b != b'{' && b != b'}')
}

/// The full Redis key for `key` under `base` (`prefix:name:`).
pub(crate) fn redis_key(base: &[u8], key: &[u8]) -> Result<Vec<u8>, RedisError> {
    if key.is_empty() {
        return Err(RedisError::EmptyKey);
    }
    let mut out = Vec::with_capacity(base.len() + MAX_READABLE.min(key.len()).max(33));
    out.extend_from_slice(base);
    if readable(key) {
        out.extend_from_slice(key);
    } else {
        out.push(b'#');
        push_hex128(&mut out, &sha1_smol::Sha1::from(key).digest().bytes());
    }
    Ok(out)
}

/// Appends the first 128 bits of `digest` as 32 lowercase hex digits,
/// without a formatter's allocation per byte.
pub(crate) fn push_hex128(out: &mut Vec<u8>, digest: &[u8; 20]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in &digest[..16] {
        out.push(HEX[usize::from(b >> 4)]);
        out.push(HEX[usize::from(b & 0xf)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_printable_keys_stay_readable() {
        assert_eq!(redis_key(b"rw:tb:", b"user:42").unwrap(), b"rw:tb:user:42");
        let k = [b'a'; 64];
        assert_eq!(redis_key(b"p:", &k).unwrap().len(), 66);
    }

    #[test]
    fn long_binary_braced_and_hash_like_keys_are_hashed_and_bounded() {
        let huge = vec![b'x'; 1 << 20];
        for key in [
            &huge[..],
            &[0u8, 159, 146, 150][..],
            b"{user}",
            b"#0123",
            b"a b",
            &[b'a'; 65][..],
        ] {
            let k = redis_key(b"rw:x:", key).unwrap();
            assert_eq!(k.len(), 5 + 33, "{key:?}");
            assert_eq!(k[5], b'#');
            // The first 16 bytes of the key's SHA-1, in lowercase hex (the
            // names every existing key in Redis was written under).
            let sha1 = sha1_smol::Sha1::from(key).digest().to_string();
            assert_eq!(&k[6..], &sha1.as_bytes()[..32], "{key:?}");
        }
        // Different keys, different names; the same key, the same name.
        assert_ne!(
            redis_key(b"", b"{a}").unwrap(),
            redis_key(b"", b"{b}").unwrap()
        );
        assert_eq!(
            redis_key(b"", &huge).unwrap(),
            redis_key(b"", &huge).unwrap()
        );
    }

    #[test]
    fn empty_keys_and_bad_names_are_refused() {
        assert_eq!(redis_key(b"p:", b""), Err(RedisError::EmptyKey));
        assert!(valid_name("login"));
        for bad in ["", "a b", "{tag}", "a:b", &"n".repeat(65), "é"] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }
}
