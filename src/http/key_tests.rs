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
    assert_eq!(
        k.extract(&RequestParts::sample(&m, &u, &h, &e), &fp),
        Err(Absent::Repeated),
        "a second line is no key, never a new one"
    );
    let both = Key::composite([Key::ip(), k.clone()]);
    assert_eq!(
        both.extract(&RequestParts::sample(&m, &u, &h, &e), &fp),
        Err(Absent::Repeated)
    );
    assert!(Key::header("bad header").has_invalid_header());
    let g = Key::global()
        .extract(&RequestParts::sample(&m, &u, &h, &e), &fp)
        .unwrap();
    assert_eq!(g, 0);
    let c = Key::composite([Key::ip(), Key::header("x-missing")]);
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
        (Key::ip(), v4, "192.0.2.77"),
        (Key::ip_prefix(24, 48), v4, "192.0.2.0/24"),
        (Key::ip(), ip("::ffff:192.0.2.77"), "192.0.2.77"),
        (Key::ip(), ip("2001:db8:1:2:3:4:5:6"), "2001:db8:1:2::/64"),
        (Key::ip_prefix(32, 128), ip("2001:db8::9"), "2001:db8::9"),
        (Key::route(), v4, "r:/items/7"),
        (Key::global(), v4, "*"),
    ];
    for (k, client, want) in cases {
        assert_eq!(bytes(&k, &h, &e, client).unwrap(), want, "{k:?}");
    }
    assert_eq!(
        bytes(&Key::ip(), &h, &e, Resolved::NoPeer),
        Err(Absent::NoPeer)
    );
    let k = Key::header("x-api-key");
    assert_eq!(bytes(&k, &h, &e, v4), Err(Absent::Value));
    h.insert("x-api-key", "alpha".parse().unwrap());
    assert_eq!(bytes(&k, &h, &e, v4).unwrap(), "h:alpha");
    h.append("x-api-key", "beta".parse().unwrap());
    assert_eq!(bytes(&k, &h, &e, v4), Err(Absent::Repeated));
    // Composites: each part with its length, so parts cannot run together.
    let c = Key::composite([Key::ip(), Key::route()]);
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

// Issue 23 item 3: the tests below kill the mutants of `key.rs` that the
// tests above left alive (docs/testing.md, "Client addresses, keys and
// headers").

/// A request with this client, headers and extensions.
fn parts<'a>(
    uri: &'a Uri,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
    client: Resolved,
) -> RequestParts<'a> {
    static GET: Method = Method::GET;
    let mut p = RequestParts::sample(&GET, uri, headers, extensions);
    p.client = client;
    p
}

#[test]
fn each_key_kind_reads_its_own_part_of_the_request() {
    #[derive(Clone, Hash)]
    struct User(u64);
    let fp = Fingerprint::new();
    let (a, b) = (Uri::from_static("/a"), Uri::from_static("/b"));
    let h = HeaderMap::new();
    let mut e = Extensions::new();
    let client = Resolved::Ip("192.0.2.1".parse().unwrap());
    let key = |k: &Key, uri: &Uri, e: &Extensions, client: Resolved| {
        k.extract(&parts(uri, &h, e, client), &fp)
    };
    // Route: the path, fingerprinted.
    let ra = key(&Key::route(), &a, &e, client).unwrap();
    assert_eq!(ra, fp.of("/a"));
    assert_ne!(ra, key(&Key::route(), &b, &e, client).unwrap());
    // Extension: absent, then its value's fingerprint.
    let x = Key::extension::<User>();
    assert_eq!(key(&x, &a, &e, client), Err(Absent::Value));
    e.insert(User(7));
    let u7 = key(&x, &a, &e, client).unwrap();
    assert_eq!(u7, fp.of(&User(7).0));
    e.insert(User(8));
    assert_ne!(u7, key(&x, &a, &e, client).unwrap());
    // Client address: the masked address; no peer and an unknown client
    // are told apart.
    let ip = Key::ip();
    assert_eq!(
        key(&ip, &a, &e, client),
        Ok(ip_key("192.0.2.1".parse().unwrap(), 32, 64))
    );
    assert_eq!(key(&ip, &a, &e, Resolved::NoPeer), Err(Absent::NoPeer));
    let unknown = Resolved::Unknown("10.0.0.1".parse().unwrap());
    assert_eq!(key(&ip, &a, &e, unknown), Err(Absent::UnknownClient));
    // Global: one key, whoever asks.
    assert_eq!(key(&Key::global(), &a, &e, unknown), Ok(0));
    // Composite: every part, in order; any part missing is missing.
    let c = Key::composite([Key::ip(), Key::route()]);
    let swapped = Key::composite([Key::route(), Key::ip()]);
    let ca = key(&c, &a, &e, client).unwrap();
    assert_ne!(ca, key(&swapped, &a, &e, client).unwrap(), "order matters");
    assert_ne!(ca, key(&c, &b, &e, client).unwrap());
    assert_ne!(ca, ra);
    assert_eq!(key(&c, &a, &e, unknown), Err(Absent::UnknownClient));
    let nested = Key::composite([Key::composite([Key::ip()]), Key::route()]);
    assert_eq!(key(&nested, &a, &e, unknown), Err(Absent::UnknownClient));
    // `key_of` gives the same local key.
    match Key::route().key_of(&parts(&a, &h, &e, client), &fp, false) {
        Ok(RuleKey::Local(k)) => assert_eq!(k, ra),
        _ => panic!("a local key"),
    }
    assert!(Key::route()
        .key_of(
            &parts(&a, &h, &Extensions::new(), Resolved::NoPeer),
            &fp,
            false
        )
        .is_ok());
    assert!(matches!(
        Key::ip().key_of(&parts(&a, &h, &e, Resolved::NoPeer), &fp, false),
        Err(Absent::NoPeer)
    ));
}

#[test]
fn prefixes_are_clamped_replaced_and_reach_every_part() {
    let v6: IpAddr = "2001:db8:1:2:3:4:5:6".parse().unwrap();
    let v4: IpAddr = "192.0.2.77".parse().unwrap();
    let fp = Fingerprint::new();
    let (u, h, e) = (Uri::from_static("/"), HeaderMap::new(), Extensions::new());
    let of = |k: &Key, ip: IpAddr| k.extract(&parts(&u, &h, &e, Resolved::Ip(ip)), &fp);
    // Clamped to 32 and 128: the whole address.
    let whole = Key::ip_prefix(200, 200);
    assert_eq!(
        of(&whole, v6),
        Ok(u128::from_be_bytes(match v6 {
            IpAddr::V6(a) => a.octets(),
            IpAddr::V4(_) => unreachable!(),
        }))
    );
    assert_eq!(of(&whole, v4), Ok(ip_key(v4, 32, 128)));
    assert_eq!(format!("{whole:?}"), "ClientIp(/32, /128)");
    // Replaced where given, kept where not, in composites too.
    let k = Key::ip().with_prefix(Some(24), None);
    assert_eq!(format!("{k:?}"), "ClientIp(/24, /64)");
    let k = Key::ip_prefix(16, 48).with_prefix(None, Some(56));
    assert_eq!(format!("{k:?}"), "ClientIp(/16, /56)");
    let c = Key::composite([Key::ip(), Key::route()]).with_prefix(Some(8), Some(32));
    assert_eq!(format!("{c:?}"), "Composite([ClientIp(/8, /32), Route])");
    assert_eq!(
        format!("{:?}", Key::global().with_prefix(Some(8), Some(8))),
        "Global"
    );
}

#[test]
fn what_a_key_needs_and_how_it_prints() {
    #[derive(Clone, Hash)]
    struct User(u64);
    assert!(Key::ip().needs_client_ip());
    assert!(Key::composite([Key::route(), Key::ip_prefix(24, 48)]).needs_client_ip());
    for k in [
        Key::route(),
        Key::global(),
        Key::header("x-api-key"),
        Key::extension::<User>(),
        Key::composite([Key::route(), Key::global()]),
    ] {
        assert!(!k.needs_client_ip(), "{k:?}");
        assert!(!k.has_invalid_header(), "{k:?}");
    }
    assert!(Key::composite([Key::route(), Key::header("bad name")]).has_invalid_header());
    assert!(!Key::composite([Key::route(), Key::header("good-name")]).has_invalid_header());
    let printed = [
        (Key::ip(), "ClientIp(/32, /64)"),
        (Key::header("X-Api-Key"), "Header(x-api-key)"),
        (Key::header("bad name"), "Header(<invalid name>)"),
        (Key::route(), "Route"),
        (Key::global(), "Global"),
        (
            Key::composite([Key::route(), Key::global()]),
            "Composite([Route, Global])",
        ),
    ];
    for (k, want) in printed {
        assert_eq!(format!("{k:?}"), want);
    }
    let x = format!("{:?}", Key::extension::<User>());
    assert!(x.starts_with("Extension(") && x.contains("User"), "{x}");
    assert_eq!(format!("{:?}", Fingerprint::new()), "Fingerprint { .. }");
}

#[test]
fn absence_reasons_are_told_apart_and_say_no_server_detail() {
    let texts = [
        Absent::NoPeer,
        Absent::UnknownClient,
        Absent::Value,
        Absent::Repeated,
    ]
    .map(Absent::describe);
    assert!(texts[0].contains("set-up error"), "{}", texts[0]);
    assert!(texts[1].contains("unknown"), "{}", texts[1]);
    assert!(texts[2].contains("does not carry"), "{}", texts[2]);
    assert!(texts[3].contains("more than once"), "{}", texts[3]);
    for t in texts {
        // The fix for the server goes to the log, not to the client.
        assert!(!t.contains("into_make_service"), "{t}");
    }
}

/// Which keys keep a readable name in Redis: addresses and the global key,
/// alone or together; anything with client material in it is hashed.
#[cfg(feature = "redis")]
#[test]
fn only_addresses_and_the_global_key_are_readable_in_redis() {
    for k in [
        Key::ip(),
        Key::ip_prefix(24, 48),
        Key::global(),
        Key::composite([Key::ip(), Key::global()]),
    ] {
        assert!(k.readable_in_redis(), "{k:?}");
    }
    #[derive(Hash)]
    struct User;
    for k in [
        Key::header("x-api-key"),
        Key::route(),
        Key::extension::<User>(),
        Key::composite([Key::ip(), Key::route()]),
        Key::composite([Key::global(), Key::header("x-api-key")]),
    ] {
        assert!(!k.readable_in_redis(), "{k:?}");
    }
}

#[test]
fn fingerprints_use_both_halves() {
    let fp = Fingerprint::new();
    let keys: Vec<u128> = (0u32..64).map(|i| fp.of(&i)).collect();
    // Two independently seeded 64-bit hashes: neither half is constant.
    assert!(keys.iter().any(|k| k >> 64 != keys[0] >> 64));
    assert!(keys
        .iter()
        .any(|k| k & u128::from(u64::MAX) != keys[0] & u128::from(u64::MAX)));
    assert!(keys.iter().all(|k| k >> 64 != 0 && *k as u64 != 0));
    // `of_bytes` hashes the bytes, not a constant.
    assert_ne!(fp.of_bytes(b"alpha"), fp.of_bytes(b"beta"));
    // Another layer's seeds give other fingerprints.
    assert_ne!(Fingerprint::new().of(&1u32), fp.of(&1u32));
}

#[cfg(feature = "redis")]
#[test]
fn the_sha1_hasher_finishes_with_its_digests_first_bytes() {
    let mut h = Sha1Hasher(sha1_smol::Sha1::new());
    h.write(b"abc");
    let d = sha1_smol::Sha1::from("abc").digest().bytes();
    let mut first = [0u8; 8];
    first.copy_from_slice(&d[..8]);
    assert_eq!(h.finish(), u64::from_le_bytes(first));
    assert_ne!(h.finish(), 0);
}

#[cfg(not(feature = "redis"))]
#[test]
fn without_redis_a_rule_key_is_the_local_fingerprint() {
    let fp = Fingerprint::new();
    let (u, h, e) = (Uri::from_static("/x"), HeaderMap::new(), Extensions::new());
    let p = parts(&u, &h, &e, Resolved::NoPeer);
    // `in_redis` is ignored without the feature.
    match Key::route().key_of(&p, &fp, true) {
        Ok(k) => assert_eq!(k.into_local(), fp.of("/x")),
        Err(e) => panic!("{e:?}"),
    }
}

/// `single_header` answers the same whether or not some name in the map has
/// a second line (the walk over a name's lines is skipped when none does).
#[test]
fn one_line_of_a_header_is_found_whatever_other_headers_repeat() {
    let name = HeaderName::from_static("x-api-key");
    let mut h = HeaderMap::new();
    assert_eq!(single_header(&h, &name).err(), Some(Absent::Value));
    h.insert("accept", "a".parse().unwrap());
    assert_eq!(single_header(&h, &name).err(), Some(Absent::Value));
    h.insert("x-api-key", "alpha".parse().unwrap());
    assert_eq!(single_header(&h, &name).unwrap(), "alpha");
    // Another name sent twice: the map has more lines than names.
    h.append("accept", "b".parse().unwrap());
    assert!(h.len() > h.keys_len());
    assert_eq!(single_header(&h, &name).unwrap(), "alpha");
    h.remove("x-api-key");
    assert_eq!(single_header(&h, &name).err(), Some(Absent::Value));
    // The name itself sent twice, alone or beside another repeated name.
    h.insert("x-api-key", "alpha".parse().unwrap());
    h.append("x-api-key", "beta".parse().unwrap());
    assert_eq!(single_header(&h, &name).err(), Some(Absent::Repeated));
    h.remove("accept");
    assert_eq!(h.len(), 2);
    assert_eq!(h.keys_len(), 1);
    assert_eq!(single_header(&h, &name).err(), Some(Absent::Repeated));
}
