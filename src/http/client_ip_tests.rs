//! Unit tests of `client_ip.rs`: entry parsing, networks, and each walk.

use super::*;
use http::HeaderValue;

fn headers(name: &str, values: &[&[u8]]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for v in values {
        h.append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_bytes(v).unwrap(),
        );
    }
    h
}

fn peer(ip: &str) -> Extensions {
    let mut e = Extensions::new();
    e.insert(SocketAddr::new(ip.parse().unwrap(), 4000));
    e
}

fn ip(s: &str) -> Resolved {
    Resolved::Ip(s.parse().unwrap())
}

fn unknown(hop: &str) -> Resolved {
    Resolved::Unknown(hop.parse().unwrap())
}

#[test]
fn nodes_parse_in_every_written_form() {
    let ok = [
        ("192.0.2.1", "192.0.2.1"),
        ("192.0.2.1:8080", "192.0.2.1"),
        ("2001:db8::1", "2001:db8::1"),
        ("[2001:db8::1]", "2001:db8::1"),
        ("[2001:db8::1]:443", "2001:db8::1"),
        ("[2001:db8::1]:_obf", "2001:db8::1"),
        ("fe80::1%eth0", "fe80::1"),
        ("[fe80::1%25eth0]:80", "fe80::1"),
        ("::ffff:192.0.2.9", "::ffff:192.0.2.9"),
    ];
    for (input, want) in ok {
        assert_eq!(
            parse_node(input.as_bytes()),
            Some(want.parse().unwrap()),
            "{input}"
        );
    }
    let bad: [&[u8]; 16] = [
        b"",
        b"unknown",
        b"_hidden",
        b"192.0.2.1:",
        b"192.0.2.1:123456",
        b"192.0.2.1:http",
        b"[2001:db8::1",
        b"[2001:db8::1]x",
        b"[192.0.2.1]",
        b"2001:db8::1%",
        b"300.1.1.1",
        b"\xff\xfe",
        b"[]",
        b"[]:80",
        b"1.2.3.4.5",
        &[b'1'; 200],
    ];
    for input in bad {
        assert_eq!(
            parse_node(input),
            None,
            "{:?}",
            String::from_utf8_lossy(input)
        );
    }
}

#[test]
fn cidrs_parse_match_and_reject_bad_input() {
    let net: Cidr = "10.0.0.0/8".parse().unwrap();
    assert!(net.contains("10.255.0.1".parse().unwrap()));
    assert!(net.contains("::ffff:10.0.0.1".parse().unwrap()));
    assert!(!net.contains("11.0.0.1".parse().unwrap()));
    assert_eq!(net.to_string(), "10.0.0.0/8");
    let v6: Cidr = "2001:db8::/32".parse().unwrap();
    assert!(v6.contains("2001:db8:ffff::1".parse().unwrap()));
    assert!(!v6.contains("2001:db9::1".parse().unwrap()));
    assert!(!v6.contains("10.0.0.1".parse().unwrap()));
    let one: Cidr = "192.0.2.7".parse().unwrap();
    assert!(one.contains("192.0.2.7".parse().unwrap()));
    assert!(!one.contains("192.0.2.8".parse().unwrap()));
    let mapped: Cidr = "::ffff:10.0.0.0/104".parse().unwrap();
    assert_eq!(mapped, net);
    let all: Cidr = "0.0.0.0/0".parse().unwrap();
    assert!(all.contains("8.8.8.8".parse().unwrap()));
    assert!(!all.contains("::1".parse().unwrap()));
    for bad in [
        "",
        "10.0.0.0/33",
        "::/129",
        "10.0.0.0/",
        "x",
        "10.0.0.0/-1",
        "::ffff:1.2.3.4/95",
    ] {
        assert!(bad.parse::<Cidr>().is_err(), "{bad}");
    }
}

#[test]
fn peer_only_ignores_headers() {
    let h = headers("x-forwarded-for", &[b"1.1.1.1"]);
    assert_eq!(
        ClientIp::peer().resolve(&h, &peer("203.0.113.5")),
        ip("203.0.113.5")
    );
    assert_eq!(
        ClientIp::peer().resolve(&h, &Extensions::new()),
        Resolved::NoPeer
    );
    // IPv4-mapped peers are unmapped.
    assert_eq!(
        ClientIp::peer().resolve(&h, &peer("::ffff:203.0.113.5")),
        ip("203.0.113.5")
    );
}

#[test]
fn the_walk_goes_from_the_right_past_trusted_hops_only() {
    let c = ClientIp::behind_proxies(["10.0.0.0/8".parse().unwrap()]);
    // Spoofed left-most entry, one trusted proxy: the proxy's view wins.
    let h = headers("x-forwarded-for", &[b"6.6.6.6, 198.51.100.7"]);
    assert_eq!(c.resolve(&h, &peer("10.0.0.1")), ip("198.51.100.7"));
    // Chains of 1..3 trusted proxies.
    let h = headers(
        "x-forwarded-for",
        &[b"6.6.6.6, 198.51.100.7, 10.0.0.3, 10.0.0.2"],
    );
    assert_eq!(c.resolve(&h, &peer("10.0.0.1")), ip("198.51.100.7"));
    // Split over several lines: still one list, right to left.
    let h = headers("x-forwarded-for", &[b"6.6.6.6, 198.51.100.7", b"10.0.0.3"]);
    assert_eq!(c.resolve(&h, &peer("10.0.0.1")), ip("198.51.100.7"));
    // An untrusted peer is the client, whatever it says.
    assert_eq!(c.resolve(&h, &peer("203.0.113.9")), ip("203.0.113.9"));
    // All trusted: the left-most trusted hop; none sent: the peer.
    let h = headers("x-forwarded-for", &[b"10.1.1.1, 10.0.0.2"]);
    assert_eq!(c.resolve(&h, &peer("10.0.0.1")), ip("10.1.1.1"));
    assert_eq!(
        c.resolve(&HeaderMap::new(), &peer("10.0.0.1")),
        ip("10.0.0.1")
    );
    // An unknown entry where the walk lands stops it.
    // The nearest trusted hop is the one that wrote it.
    let h = headers("x-forwarded-for", &[b"198.51.100.7, unknown, 10.0.0.2"]);
    assert_eq!(c.resolve(&h, &peer("10.0.0.1")), unknown("10.0.0.2"));
    let h = headers("x-forwarded-for", &[b"198.51.100.7, unknown"]);
    assert_eq!(c.resolve(&h, &peer("10.0.0.1")), unknown("10.0.0.1"));
    // Empty elements are skipped; mapped addresses are unmapped.
    let h = headers("x-forwarded-for", &[b"::ffff:198.51.100.7,, 10.0.0.2 ,"]);
    assert_eq!(c.resolve(&h, &peer("10.0.0.1")), ip("198.51.100.7"));
}

#[test]
fn hop_counts_take_the_nth_entry_from_the_right() {
    let h = headers("x-forwarded-for", &[b"6.6.6.6, 198.51.100.7, 10.0.0.3"]);
    let p = peer("10.0.0.1");
    assert_eq!(ClientIp::behind_hops(0).resolve(&h, &p), ip("10.0.0.1"));
    assert_eq!(ClientIp::behind_hops(1).resolve(&h, &p), ip("10.0.0.3"));
    assert_eq!(ClientIp::behind_hops(2).resolve(&h, &p), ip("198.51.100.7"));
    assert_eq!(ClientIp::behind_hops(3).resolve(&h, &p), ip("6.6.6.6"));
    // Fewer entries than hops: the left-most; none: the peer.
    assert_eq!(ClientIp::behind_hops(5).resolve(&h, &p), ip("6.6.6.6"));
    assert_eq!(
        ClientIp::behind_hops(1).resolve(&HeaderMap::new(), &p),
        ip("10.0.0.1")
    );
}

#[test]
fn hop_counts_from_named_peers_ignore_the_headers_of_any_other_peer() {
    let lb: Cidr = "10.0.0.0/8".parse().unwrap();
    let c = ClientIp::behind_hops(1).from_peers([lb, "fd00::/8".parse().unwrap()]);
    let forged = headers("x-forwarded-for", &[b"198.51.100.7"]);
    // Through a load balancer: the chain is read as before.
    assert_eq!(c.resolve(&forged, &peer("10.0.0.1")), ip("198.51.100.7"));
    assert_eq!(c.resolve(&forged, &peer("fd00::9")), ip("198.51.100.7"));
    assert_eq!(
        c.resolve(&forged, &peer("::ffff:10.1.1.1")),
        ip("198.51.100.7")
    );
    // Directly: the peer, whatever it wrote (a list, garbage, a Forwarded).
    assert_eq!(c.resolve(&forged, &peer("203.0.113.9")), ip("203.0.113.9"));
    let garbage = headers("x-forwarded-for", &[b"unknown"]);
    assert_eq!(c.resolve(&garbage, &peer("203.0.113.9")), ip("203.0.113.9"));
    assert_eq!(c.resolve(&garbage, &peer("10.0.0.1")), unknown("10.0.0.1"));
    let fwd = c.clone().header(ProxyHeader::Forwarded);
    let h = headers("forwarded", &[b"for=198.51.100.7"]);
    assert_eq!(fwd.resolve(&h, &peer("2001:db8::5")), ip("2001:db8::5"));
    assert_eq!(fwd.resolve(&h, &peer("10.9.9.9")), ip("198.51.100.7"));
    // An empty list trusts no peer: every request is its peer's.
    let none = ClientIp::behind_hops(1).from_peers([]);
    assert_eq!(none.resolve(&forged, &peer("10.0.0.1")), ip("10.0.0.1"));
    // With another trust, both checks apply; the last list counts.
    let cdn = ClientIp::single_header("cf-connecting-ip", ["173.245.48.0/20".parse().unwrap()])
        .from_peers([lb])
        .from_peers(["173.245.48.0/24".parse().unwrap()]);
    let h = headers("cf-connecting-ip", &[b"198.51.100.7"]);
    assert_eq!(cdn.resolve(&h, &peer("173.245.48.1")), ip("198.51.100.7"));
    assert_eq!(cdn.resolve(&h, &peer("173.245.49.1")), ip("173.245.49.1"));
    assert!(format!("{c:?}").contains("peers: Some([10.0.0.0/8, fd00::/8])"));
}

#[test]
fn only_a_hop_count_without_peers_is_warned_about() {
    let lb: Cidr = "10.0.0.0/8".parse().unwrap();
    assert!(ClientIp::behind_hops(1).hops_from_any_peer());
    assert!(ClientIp::behind_hops(2)
        .header(ProxyHeader::Forwarded)
        .hops_from_any_peer());
    assert!(!ClientIp::behind_hops(1)
        .from_peers([lb])
        .hops_from_any_peer());
    assert!(!ClientIp::behind_hops(0).hops_from_any_peer());
    assert!(!ClientIp::peer().hops_from_any_peer());
    assert!(!ClientIp::behind_proxies([lb]).hops_from_any_peer());
    assert!(!ClientIp::single_header("x-ip", [lb]).hops_from_any_peer());
}

#[test]
fn forwarded_is_walked_with_quotes_and_obfuscation_stops_it() {
    let c =
        ClientIp::behind_proxies(["10.0.0.0/8".parse().unwrap()]).header(ProxyHeader::Forwarded);
    let p = peer("10.0.0.1");
    let h = headers(
        "forwarded",
        &[b"for=6.6.6.6, for=\"[2001:db8:cafe::17]:4711\";proto=https, For=10.0.0.2;by=10.0.0.1"],
    );
    assert_eq!(c.resolve(&h, &p), ip("2001:db8:cafe::17"));
    let h = headers(
        "forwarded",
        &[b"for=198.51.100.7, for=_hidden, for=10.0.0.2"],
    );
    assert_eq!(c.resolve(&h, &p), unknown("10.0.0.2"));
    let h = headers("forwarded", &[b"for=198.51.100.7, for=unknown"]);
    assert_eq!(c.resolve(&h, &p), unknown("10.0.0.1"));
    // A comma inside quotes does not split; a stray quote or escape is malformed.
    let h = headers("forwarded", &[b"for=\"1.2.3.4,5\""]);
    assert_eq!(c.resolve(&h, &p), unknown("10.0.0.1"));
    let h = headers("forwarded", &[b"for=\"198.51.100.7"]);
    assert_eq!(c.resolve(&h, &p), unknown("10.0.0.1"));
    let h = headers("forwarded", &[b"for=\"a\\\"b\""]);
    assert_eq!(c.resolve(&h, &p), unknown("10.0.0.1"));
    // An element without for= stops the walk too.
    let h = headers("forwarded", &[b"for=198.51.100.7, proto=https"]);
    assert_eq!(c.resolve(&h, &p), unknown("10.0.0.1"));
}

#[test]
fn hostile_headers_never_panic_and_bound_the_walk() {
    let c = ClientIp::behind_proxies(["0.0.0.0/0".parse().unwrap(), "::/0".parse().unwrap()]);
    let p = peer("10.0.0.1");
    let mut long = Vec::new();
    for i in 0..10_000u32 {
        long.extend_from_slice(format!("10.{}.{}.1, ", (i >> 8) & 255, i & 255).as_bytes());
    }
    for name in ["x-forwarded-for", "forwarded"] {
        let header = if name == "forwarded" {
            ProxyHeader::Forwarded
        } else {
            ProxyHeader::XForwardedFor
        };
        let c = c.clone().header(header);
        let h = headers(name, &[&long]);
        // X-Forwarded-For: the last trusted hop read before the cap (the
        // 32nd from the right); Forwarded: the first element has no `for=`.
        let hop = if name == "forwarded" {
            "10.0.0.1"
        } else {
            "10.38.240.1"
        };
        assert_eq!(c.resolve(&h, &p), unknown(hop), "{name}: too long");
        let inputs: [&[u8]; 10] = [
            b"",
            b",,,,",
            b"\"",
            b"[",
            b"]",
            b"[::1",
            b"for=",
            b";;;=;=",
            b"\x80\x81",
            b"[fe80::1%]:99999",
        ];
        for input in inputs {
            let h = headers(name, &[input]);
            let r = c.resolve(&h, &p);
            assert!(
                matches!(r, Resolved::Unknown(_) | Resolved::Ip(_)),
                "{name} {input:?}"
            );
        }
    }
    // Non-UTF-8 (obs-text) values are rejected entries, not panics.
    let h = headers("x-forwarded-for", &[b"\xe9\xe9, 10.0.0.2"]);
    let trusted = ClientIp::behind_proxies(["10.0.0.0/8".parse().unwrap()]);
    assert_eq!(trusted.resolve(&h, &p), unknown("10.0.0.2"));
}

#[test]
fn single_header_is_believed_only_from_its_networks() {
    let c = ClientIp::single_header("cf-connecting-ip", ["173.245.48.0/20".parse().unwrap()]);
    let h = headers("cf-connecting-ip", &[b"198.51.100.7"]);
    assert_eq!(c.resolve(&h, &peer("173.245.48.1")), ip("198.51.100.7"));
    assert_eq!(c.resolve(&h, &peer("203.0.113.1")), ip("203.0.113.1"));
    let twice = headers("cf-connecting-ip", &[b"198.51.100.7", b"1.1.1.1"]);
    assert_eq!(
        c.resolve(&twice, &peer("173.245.48.1")),
        unknown("173.245.48.1")
    );
    assert_eq!(
        c.resolve(&HeaderMap::new(), &peer("173.245.48.1")),
        unknown("173.245.48.1")
    );
}

// Issue 23 item 3: each test below failed on the mutant it names (planted
// by hand once, then reverted).

#[test]
fn hop_counts_in_long_chains_trust_exactly_that_many_hops() {
    // Six entries: one hop more or less than configured picks a neighbour.
    let h = headers(
        "x-forwarded-for",
        &[b"6.6.6.1, 6.6.6.2, 6.6.6.3, 6.6.6.4, 6.6.6.5, 6.6.6.6"],
    );
    let p = peer("10.0.0.1");
    for hops in 1..=6usize {
        let want = format!("6.6.6.{}", 7 - hops);
        assert_eq!(
            ClientIp::behind_hops(hops).resolve(&h, &p),
            ip(&want),
            "{hops} hops"
        );
    }
    assert_eq!(ClientIp::behind_hops(7).resolve(&h, &p), ip("6.6.6.1"));
    // The same over several lines, with the Forwarded header.
    let h = headers(
        "forwarded",
        &[b"for=6.6.6.1, for=6.6.6.2", b"for=6.6.6.3, for=6.6.6.4"],
    );
    for hops in 1..=4usize {
        let c = ClientIp::behind_hops(hops).header(ProxyHeader::Forwarded);
        assert_eq!(c.resolve(&h, &p), ip(&format!("6.6.6.{}", 5 - hops)));
    }
    // An unknown entry where the walk lands keeps the hop before it.
    let h = headers("x-forwarded-for", &[b"6.6.6.1, unknown, 6.6.6.3, 6.6.6.4"]);
    assert_eq!(ClientIp::behind_hops(3).resolve(&h, &p), unknown("6.6.6.3"));
    assert_eq!(ClientIp::behind_hops(2).resolve(&h, &p), ip("6.6.6.3"));
    // An unknown entry past the client is never read.
    assert_eq!(ClientIp::behind_hops(1).resolve(&h, &p), ip("6.6.6.4"));
}

#[derive(Clone)]
struct CustomPeer(IpAddr);

#[test]
fn a_custom_peer_lookup_is_used_first_and_may_capture() {
    let mut e = Extensions::new();
    e.insert(CustomPeer("198.51.100.9".parse().unwrap()));
    let none = HeaderMap::new();
    let c = ClientIp::behind_hops(1).peer_from(|ext| ext.get::<CustomPeer>().map(|p| p.0));
    assert_eq!(c.resolve(&none, &e), ip("198.51.100.9"));
    // Before the built-in sources; mapped addresses are unmapped.
    e.insert(SocketAddr::new("203.0.113.1".parse().unwrap(), 1));
    assert_eq!(c.resolve(&none, &e), ip("198.51.100.9"));
    let mapped = ClientIp::peer().peer_from(|_| "::ffff:192.0.2.4".parse().ok());
    assert_eq!(mapped.resolve(&none, &e), ip("192.0.2.4"));
    // `None` falls back to them.
    let nothing = ClientIp::peer().peer_from(|_| None);
    assert_eq!(nothing.resolve(&none, &e), ip("203.0.113.1"));
    // A capturing closure: the address comes from configuration.
    let configured: IpAddr = "192.0.2.77".parse().unwrap();
    let c = ClientIp::peer().peer_from(move |_| Some(configured));
    assert_eq!(c.resolve(&none, &Extensions::new()), ip("192.0.2.77"));
    assert!(format!("{c:?}").contains("custom_peer: true"));
}

#[test]
fn only_the_peer_setting_trusts_no_proxy() {
    assert!(!ClientIp::peer().trusts_proxies());
    assert!(!ClientIp::default().trusts_proxies());
    assert!(ClientIp::behind_proxies(["10.0.0.0/8".parse().unwrap()]).trusts_proxies());
    assert!(ClientIp::behind_hops(1).trusts_proxies());
    assert!(ClientIp::single_header("cf-connecting-ip", []).trusts_proxies());
}

#[test]
fn bare_mapped_addresses_and_v6_host_networks_parse() {
    // A bare IPv4-mapped address is a network of one IPv4 address.
    let one: Cidr = "::ffff:10.0.0.5".parse().unwrap();
    assert_eq!(one, "10.0.0.5".parse().unwrap());
    assert!(one.contains("10.0.0.5".parse().unwrap()));
    assert!(!one.contains("10.0.0.6".parse().unwrap()));
    // An IPv6 /128, written and bare.
    let host: Cidr = "2001:db8::1/128".parse().unwrap();
    assert_eq!(host, "2001:db8::1".parse().unwrap());
    assert!(host.contains("2001:db8::1".parse().unwrap()));
    assert!(!host.contains("2001:db8::2".parse().unwrap()));
    assert!(!host.contains("2001:db8::".parse().unwrap()));
    assert_eq!(host.to_string(), "2001:db8::1/128");
    assert_eq!(mask(128), u128::MAX);
    assert_eq!(mask(127), u128::MAX - 1);
    assert_eq!(mask(1), 1 << 127);
    assert_eq!(mask(0), 0);
}

// Issue 23 item 3, the cargo-mutants run: the survivors it found.

#[test]
fn networks_print_as_written_and_errors_say_what_to_write() {
    for (input, shown) in [
        ("10.0.0.0/8", "10.0.0.0/8"),
        ("10.1.2.3/8", "10.0.0.0/8"),
        ("192.0.2.7", "192.0.2.7/32"),
        ("::ffff:10.0.0.0/104", "10.0.0.0/8"),
        ("2001:db8::/32", "2001:db8::/32"),
        ("::/0", "::/0"),
        ("0.0.0.0/0", "0.0.0.0/0"),
    ] {
        let net: Cidr = input.parse().unwrap();
        assert_eq!(net.to_string(), shown, "{input}");
        assert_eq!(format!("{net:?}"), shown, "{input}");
    }
    let err = "10.0.0.0/33".parse::<Cidr>().unwrap_err();
    let msg = err.to_string();
    assert!(msg.starts_with("`10.0.0.0/33` is not a network"), "{msg}");
    assert!(msg.contains("at most /32 for IPv4, /128 for IPv6"), "{msg}");
}

/// `n` entries `10.0.0.1 .. 10.0.0.n`, left to right.
fn chain_of(n: u8) -> HeaderMap {
    let list: Vec<String> = (1..=n).map(|i| format!("10.0.0.{i}")).collect();
    headers("x-forwarded-for", &[list.join(", ").as_bytes()])
}

#[test]
fn the_walk_reads_exactly_max_hops_entries() {
    // Every entry trusted: 32 entries are walked to the left-most; a 33rd
    // makes the chain too long, and the nearest trusted hop is the 32nd
    // from the right.
    let all = ClientIp::behind_proxies(["10.0.0.0/8".parse().unwrap()]);
    let p = peer("10.9.9.9");
    assert_eq!(MAX_HOPS, 32);
    assert_eq!(all.resolve(&chain_of(31), &p), ip("10.0.0.1"));
    assert_eq!(all.resolve(&chain_of(32), &p), ip("10.0.0.1"));
    assert_eq!(all.resolve(&chain_of(33), &p), unknown("10.0.0.2"));
    assert_eq!(all.resolve(&chain_of(40), &p), unknown("10.0.0.9"));
    // A hop count past the cap: the same bound.
    for hops in [32, 33, 40, 100] {
        let c = ClientIp::behind_hops(hops);
        assert_eq!(c.resolve(&chain_of(32), &p), ip("10.0.0.1"), "{hops}");
    }
    assert_eq!(
        ClientIp::behind_hops(33).resolve(&chain_of(33), &p),
        unknown("10.0.0.2")
    );
    assert_eq!(
        ClientIp::behind_hops(40).resolve(&chain_of(40), &p),
        unknown("10.0.0.9")
    );
    assert_eq!(
        ClientIp::behind_hops(32).resolve(&chain_of(40), &p),
        ip("10.0.0.9")
    );
}

#[test]
fn entries_longer_than_the_cap_are_not_addresses_even_when_they_parse() {
    // A zone id pads a valid address to any length.
    let padded = |len: usize| {
        let mut s = b"fe80::1%".to_vec();
        s.resize(len, b'z');
        s
    };
    assert_eq!(MAX_NODE_LEN, 96);
    assert_eq!(parse_node(&padded(96)), Some("fe80::1".parse().unwrap()));
    assert_eq!(parse_node(&padded(97)), None);
    assert_eq!(parse_node(&padded(300)), None);
    // Obfuscated ports: `_` and at least one more allowed character.
    assert_eq!(
        parse_node(b"[2001:db8::1]:_a.b-c_9"),
        Some("2001:db8::1".parse().unwrap())
    );
    for bad in [
        &b"[2001:db8::1]:_"[..],
        b"[2001:db8::1]:_a/b",
        b"[2001:db8::1]:_a b",
        b"192.0.2.1:_",
        b"192.0.2.1:1_",
    ] {
        assert_eq!(parse_node(bad), None, "{}", String::from_utf8_lossy(bad));
    }
    assert_eq!(
        parse_node(b"192.0.2.1:65535"),
        Some("192.0.2.1".parse().unwrap())
    );
    assert_eq!(
        parse_node(b"192.0.2.1:_x"),
        Some("192.0.2.1".parse().unwrap())
    );
}

#[test]
fn quotes_keep_commas_and_escapes_or_open_quotes_make_an_entry_malformed() {
    let c =
        ClientIp::behind_proxies(["10.0.0.0/8".parse().unwrap()]).header(ProxyHeader::Forwarded);
    let p = peer("10.0.0.1");
    let walk = |line: &[u8]| c.resolve(&headers("forwarded", &[line]), &p);
    // A comma inside another parameter's quoted value does not split the
    // element: its `for=` is still read.
    assert_eq!(walk(b"for=192.0.2.60;by=\"a,b\""), ip("192.0.2.60"));
    assert_eq!(
        walk(b"for=6.6.6.6, for=192.0.2.60;by=\"a,b,c\";proto=http"),
        ip("192.0.2.60")
    );
    // Quotes open and closed again: the elements around them still split.
    assert_eq!(walk(b"for=\"192.0.2.61\", for=10.0.0.2"), ip("192.0.2.61"));
    // An escape, or a quote left open, makes the element malformed even
    // when its `for=` is fine: the walk stops at the hop that wrote it.
    assert_eq!(walk(b"for=192.0.2.60;by=\"a\\\\b\""), unknown("10.0.0.1"));
    assert_eq!(walk(b"for=192.0.2.60;by=\"x"), unknown("10.0.0.1"));
    assert_eq!(
        walk(b"for=6.6.6.6, for=192.0.2.60;by=\"x, for=10.0.0.2"),
        unknown("10.0.0.2")
    );
}
