//! Unit tests of `key.rs`: keys, their two encodings, fingerprints.

use super::*;

#[test]
fn keys_separate_values_and_report_absence() {
    let fp = Fingerprint::new();
    let (m, u) = (Method::GET, Uri::from_static("/a"));
    let e = Extensions::new();
    let mut h = HeaderMap::new();
    let k = Key::header("x-api-key");
    assert_eq!(
        k.extract(&RequestParts::sample(&m, &u, &h, &e), &fp),
        Err(Absent::Value)
    );
    h.insert("x-api-key", "alpha".parse().unwrap());
    let a = k
        .extract(&RequestParts::sample(&m, &u, &h, &e), &fp)
        .unwrap();
    h.insert("x-api-key", "beta".parse().unwrap());
    let b = k
        .extract(&RequestParts::sample(&m, &u, &h, &e), &fp)
        .unwrap();
    assert_ne!(a, b);
    h.append("x-api-key", "gamma".parse().unwrap());
    let bg = k
        .extract(&RequestParts::sample(&m, &u, &h, &e), &fp)
        .unwrap();
    assert_ne!(bg, b, "a second line changes the key");
    assert!(Key::header("bad header").has_invalid_header());
    let g = Key::global()
        .extract(&RequestParts::sample(&m, &u, &h, &e), &fp)
        .unwrap();
    assert_eq!(g, 0);
    let c = Key::composite([Key::client_ip(), Key::header("x-missing")]);
    assert_eq!(
        c.extract(&RequestParts::sample(&m, &u, &h, &e), &fp),
        Err(Absent::Value)
    );
}

#[cfg(feature = "redis")]
#[test]
fn byte_keys_are_the_same_in_every_process_and_unambiguous() {
    #[derive(Clone, Hash)]
    struct User(u64);
    let (m, u) = (Method::GET, Uri::from_static("/items/7"));
    let mut e = Extensions::new();
    let mut h = HeaderMap::new();
    let bytes = |k: &Key, h: &HeaderMap, e: &Extensions, client: Resolved| {
        let mut p = RequestParts::sample(&m, &u, h, e);
        p.client = client;
        let mut out = Vec::new();
        k.extract_bytes(&p, &mut out)
            .map(|()| String::from_utf8_lossy(&out).into_owned())
    };
    let ip = |s: &str| Resolved::Ip(s.parse().unwrap());
    let v4 = ip("192.0.2.77");
    let cases = [
        (Key::client_ip(), v4, "192.0.2.77"),
        (Key::client_ip_prefix(24, 48), v4, "192.0.2.0/24"),
        (Key::client_ip(), ip("::ffff:192.0.2.77"), "192.0.2.77"),
        (
            Key::client_ip(),
            ip("2001:db8:1:2:3:4:5:6"),
            "2001:db8:1:2::/64",
        ),
        (
            Key::client_ip_prefix(32, 128),
            ip("2001:db8::9"),
            "2001:db8::9",
        ),
        (Key::route(), v4, "r:/items/7"),
        (Key::global(), v4, "*"),
    ];
    for (k, client, want) in cases {
        assert_eq!(bytes(&k, &h, &e, client).unwrap(), want, "{k:?}");
    }
    assert_eq!(
        bytes(&Key::client_ip(), &h, &e, Resolved::NoPeer),
        Err(Absent::NoPeer)
    );
    let k = Key::header("x-api-key");
    assert_eq!(bytes(&k, &h, &e, v4), Err(Absent::Value));
    h.insert("x-api-key", "alpha".parse().unwrap());
    assert_eq!(bytes(&k, &h, &e, v4).unwrap(), "h:alpha");
    h.append("x-api-key", "beta".parse().unwrap());
    assert_eq!(bytes(&k, &h, &e, v4).unwrap(), "h:alpha\0beta");
    // Composites: each part with its length, so parts cannot run together.
    let c = Key::composite([Key::client_ip(), Key::route()]);
    assert_eq!(bytes(&c, &h, &e, v4).unwrap(), "10:192.0.2.7710:r:/items/7");
    // Extensions: a SHA-1 of the `Hash`, the same whatever the seed.
    let x = Key::extension::<User>();
    assert_eq!(bytes(&x, &h, &e, v4), Err(Absent::Value));
    e.insert(User(42));
    let a = bytes(&x, &h, &e, v4).unwrap();
    assert_eq!(a.len(), 2 + 32);
    assert_eq!(a, bytes(&x, &h, &e, v4).unwrap());
    e.insert(User(43));
    assert_ne!(a, bytes(&x, &h, &e, v4).unwrap());
    let mut fixed = Sha1Hasher(sha1_smol::Sha1::new());
    42u64.hash(&mut fixed);
    let digest = fixed.0.digest().bytes();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(a, format!("x:{hex}"));
}

#[test]
fn ip_keys_group_by_prefix_and_never_mix_families() {
    let a = ip_key("2001:db8:1:2:aaaa::1".parse().unwrap(), 32, 64);
    let b = ip_key("2001:db8:1:2:bbbb::9".parse().unwrap(), 32, 64);
    let c = ip_key("2001:db8:1:3::1".parse().unwrap(), 32, 64);
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_eq!(
        ip_key("2001:db8:1:3::1".parse().unwrap(), 32, 48),
        ip_key("2001:db8:1:2::1".parse().unwrap(), 32, 48)
    );
    let v4 = ip_key("192.0.2.1".parse().unwrap(), 32, 64);
    assert_eq!(v4, ip_key("::ffff:192.0.2.1".parse().unwrap(), 32, 64));
    assert_ne!(v4, ip_key("192.0.2.2".parse().unwrap(), 32, 64));
    assert_eq!(
        ip_key("192.0.2.1".parse().unwrap(), 24, 64),
        ip_key("192.0.2.200".parse().unwrap(), 24, 64)
    );
    assert_ne!(
        ip_key("192.0.2.1".parse().unwrap(), 24, 64),
        ip_key("192.0.3.1".parse().unwrap(), 24, 64)
    );
    assert_ne!(
        ip_key("::".parse().unwrap(), 32, 64),
        ip_key("0.0.0.0".parse().unwrap(), 32, 64)
    );
}

#[test]
fn byte_fingerprints_tell_prefixes_and_zero_padding_apart() {
    // One write per value, no length prefix: the hasher's own length
    // mixing must still separate these.
    let fp = Fingerprint::new();
    let values: [&[u8]; 6] = [b"", b"\0", b"\0\0", b"a", b"a\0", b"key-0123456789abcdef"];
    for (i, a) in values.iter().enumerate() {
        assert_eq!(fp.of_bytes(a), fp.of_bytes(a));
        for b in &values[i + 1..] {
            assert_ne!(fp.of_bytes(a), fp.of_bytes(b), "{a:?} {b:?}");
        }
    }
}
