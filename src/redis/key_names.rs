//! How the HTTP layer names a request's key in Redis when the key is
//! client material (a header such as an API key, an extension, a route,
//! a composite): by default a hash, never the value itself, and with a
//! secret that every instance sharing the store is given, a keyed hash,
//! so that nobody outside can compute a key's name (nor aim a key at a
//! Redis Cluster slot). Client addresses and the global key keep their
//! readable names.
//!
//! ```text
//! Hashed (default)   ~<32 hex: the first 128 bits of SHA-1(material)>
//! Keyed(secret)      ~<32 hex: the first 128 bits of HMAC-SHA-1(secret, material)>
//! Readable (debug)   the material as it is (h:<header value>, r:<route>, ...)
//! ```
//!
//! A name starts with `~`, which no material starts with (material is
//! `h:`, `x:`, `r:`, `*`, an address or a length), and which the Redis
//! limiter keeps as it is (a key part starting with `#` it hashes again,
//! and `#b:` marks a lockout's block).
//!
//! The material is what `Key::extract_bytes` writes (`h:` and the value,
//! a composite's parts with their lengths): distinct keys have distinct
//! material, so distinct names but for a hash collision (2^-64 for any
//! pair under a 128-bit truncation).

use std::fmt;
use std::sync::Arc;

/// How client key material is named in Redis (see the module docs).
#[derive(Clone, Default)]
pub(crate) enum KeyNames {
    #[default]
    Hashed,
    Keyed(Arc<[u8]>),
    Readable,
}

impl fmt::Debug for KeyNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secret.
        f.write_str(match self {
            KeyNames::Hashed => "Hashed",
            KeyNames::Keyed(_) => "Keyed(<secret>)",
            KeyNames::Readable => "Readable",
        })
    }
}

impl KeyNames {
    /// The name of key material `material`.
    pub(crate) fn name(&self, material: Vec<u8>) -> Vec<u8> {
        let digest = match self {
            KeyNames::Readable => return material,
            KeyNames::Hashed => sha1_smol::Sha1::from(&material).digest().bytes(),
            KeyNames::Keyed(secret) => hmac_sha1(secret, &material),
        };
        let mut out = Vec::with_capacity(33);
        out.push(b'~');
        super::key::push_hex128(&mut out, &digest);
        out
    }
}

/// HMAC-SHA-1 (RFC 2104) of `message` under `key`: a keyed pseudo-random
/// function, which is all a name needs (SHA-1's collision attacks do not
/// reach HMAC).
fn hmac_sha1(key: &[u8], message: &[u8]) -> [u8; 20] {
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..20].copy_from_slice(&sha1_smol::Sha1::from(key).digest().bytes());
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = sha1_smol::Sha1::new();
    inner.update(&k.map(|b| b ^ 0x36));
    inner.update(message);
    let mut outer = sha1_smol::Sha1::new();
    outer.update(&k.map(|b| b ^ 0x5c));
    outer.update(&inner.digest().bytes());
    outer.digest().bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// RFC 2202's test cases 1, 2 and 6 (a key longer than a block).
    #[test]
    fn hmac_sha1_matches_rfc_2202() {
        assert_eq!(
            hex(&hmac_sha1(&[0x0b; 20], b"Hi There")),
            "b617318655057264e28bc0b6fb378c8ef146be00"
        );
        assert_eq!(
            hex(&hmac_sha1(b"Jefe", b"what do ya want for nothing?")),
            "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"
        );
        assert_eq!(
            hex(&hmac_sha1(
                &[0xaa; 80],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "aa4ae5e15272d00e95705637ce8a3b55ed402112"
        );
        // A key of exactly one block is used as it is; one byte more is
        // hashed first (Python's `hmac` module gave both).
        let msg = b"a key of exactly one block";
        assert_eq!(
            hex(&hmac_sha1(&[b'a'; 64], msg)),
            "741e1ab2409c22c04ba2b5942abe993161b3710a"
        );
        assert_eq!(
            hex(&hmac_sha1(&[b'a'; 65], msg)),
            "e34879e42a847dc241abf187a3bc59a79c9d346b"
        );
    }

    #[test]
    fn names_hide_the_material_and_only_the_secret_reproduces_them() {
        let m = || b"h:premium-1".to_vec();
        let hashed = KeyNames::Hashed.name(m());
        let keyed = KeyNames::Keyed(Arc::from(&b"s3cret"[..])).name(m());
        let other = KeyNames::Keyed(Arc::from(&b"other"[..])).name(m());
        for n in [&hashed, &keyed, &other] {
            assert_eq!(n.len(), 33);
            assert_eq!(n[0], b'~');
            assert!(!n.windows(9).any(|w| w == b"premium-1"));
        }
        assert_ne!(hashed, keyed);
        assert_ne!(keyed, other);
        assert_eq!(keyed, KeyNames::Keyed(Arc::from(&b"s3cret"[..])).name(m()));
        assert_eq!(KeyNames::Readable.name(m()), m());
        assert_eq!(
            format!("{:?}", KeyNames::Keyed(Arc::from(&b"s3cret"[..]))),
            "Keyed(<secret>)"
        );
    }
}
