//! The keys rules count requests under: [`Key`], how a request's key is
//! extracted, and its two encodings. A local table keys by a 128-bit
//! [`Fingerprint`] (seeded per layer, so nobody outside can aim for a
//! collision); a Redis rule keys by bytes that every instance computes alike
//! (`extract_bytes`). The two stay apart on purpose: the fingerprint hashes
//! in place, with no allocation per request, and its seed must differ per
//! process, while the bytes must be the same in every process.

use super::client_ip::{mask, unmap, Resolved};
use http::header::{HeaderName, HeaderValue};
use http::{Extensions, HeaderMap, Method, Uri};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;

/// How a rule's keys are shown to operators (top offenders): client
/// addresses in full, anything else (header values such as API keys or
/// tokens, extensions, routes, composites) only as a fingerprint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Shown {
    /// A client address (or its prefix) keyed by `ip_key`.
    Ip { v4_prefix: u8, v6_prefix: u8 },
    /// The first 64 bits of the layer's 128-bit fingerprint, in hex.
    Fingerprint,
}

/// What a rule counts requests under.
///
/// # Example
///
/// ```
/// use ratewall::http::Key;
///
/// #[derive(Clone, Hash)]
/// struct UserId(u64);
///
/// let per_user = Key::extension::<UserId>();
/// let per_key = Key::header("x-api-key");
/// let both = Key::composite([Key::ip(), Key::header("x-api-key")]);
/// # let _ = (per_user, per_key, both);
/// ```
#[derive(Clone)]
pub struct Key(KeyKind);

#[derive(Clone)]
enum KeyKind {
    ClientIp {
        v4_prefix: u8,
        v6_prefix: u8,
    },
    Header(Option<HeaderName>),
    Extension(
        &'static str,
        fn(&Extensions, &Fingerprint) -> Option<u128>,
        // The key as bytes, for Redis rules.
        #[cfg_attr(not(feature = "redis"), allow(dead_code))]
        fn(&Extensions, &mut dyn Hasher) -> bool,
    ),
    Route,
    Global,
    Composite(Vec<Key>),
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            KeyKind::ClientIp {
                v4_prefix,
                v6_prefix,
            } => write!(f, "ClientIp(/{v4_prefix}, /{v6_prefix})"),
            KeyKind::Header(Some(h)) => write!(f, "Header({h})"),
            KeyKind::Header(None) => f.write_str("Header(<invalid name>)"),
            KeyKind::Extension(t, _, _) => write!(f, "Extension({t})"),
            KeyKind::Route => f.write_str("Route"),
            KeyKind::Global => f.write_str("Global"),
            KeyKind::Composite(keys) => f.debug_tuple("Composite").field(keys).finish(),
        }
    }
}

fn extension_key<T: Hash + Send + Sync + 'static>(
    ext: &Extensions,
    fp: &Fingerprint,
) -> Option<u128> {
    ext.get::<T>().map(|v| fp.of(v))
}

fn extension_hash<T: Hash + Send + Sync + 'static>(ext: &Extensions, h: &mut dyn Hasher) -> bool {
    ext.get::<T>().map(|v| v.hash(&mut &mut *h)).is_some()
}

impl Key {
    /// The client's IP address (see [`ClientIp`](super::ClientIp)): IPv4 per
    /// address, IPv6 per /64. One word for one key: `Key::ip()`,
    /// [`Rule::per_ip`](super::Rule::per_ip) and `key = "ip"` in a
    /// configuration file.
    ///
    /// ```
    /// # use ratewall::http::Key;
    /// let k = Key::ip();
    /// # let _ = k;
    /// ```
    pub fn ip() -> Key {
        Key(KeyKind::ClientIp {
            v4_prefix: 32,
            v6_prefix: 64,
        })
    }

    /// The client's IP address, IPv4 by its first `v4_prefix` bits and
    /// IPv6 by its first `v6_prefix` bits (clamped to 32 and 128).
    ///
    /// ```
    /// # use ratewall::http::Key;
    /// let per_site = Key::ip_prefix(24, 48);
    /// # let _ = per_site;
    /// ```
    pub fn ip_prefix(v4_prefix: u8, v6_prefix: u8) -> Key {
        Key(KeyKind::ClientIp {
            v4_prefix: v4_prefix.min(32),
            v6_prefix: v6_prefix.min(128),
        })
    }

    /// The value of a request header (an API key), as a 128-bit
    /// fingerprint. An invalid header name is reported when the layer is
    /// built.
    ///
    /// A request that sends the header **more than once** has no key for
    /// the rule, and an enforced rule answers it `400 Bad Request`,
    /// whatever [`when_missing`](super::Rule::when_missing) says:
    /// applications read the first line, so a key made of every line would
    /// let a client pair its real key with a fresh one on each request and
    /// never meet its limit, and skipping the rule would let it through
    /// unlimited (docs/security.md).
    ///
    /// ```
    /// # use ratewall::http::Key;
    /// let k = Key::header("x-api-key");
    /// # let _ = k;
    /// ```
    pub fn header(name: &str) -> Key {
        Key(KeyKind::Header(
            HeaderName::from_bytes(name.as_bytes()).ok(),
        ))
    }

    /// A request extension of type `T` (the user id an auth layer set), as a
    /// 128-bit fingerprint of its `Hash`.
    ///
    /// ```
    /// # use ratewall::http::Key;
    /// #[derive(Clone, Hash)]
    /// struct UserId(u64);
    /// let k = Key::extension::<UserId>();
    /// # let _ = k;
    /// ```
    pub fn extension<T: Hash + Send + Sync + 'static>() -> Key {
        Key(KeyKind::Extension(
            std::any::type_name::<T>(),
            extension_key::<T>,
            extension_hash::<T>,
        ))
    }

    /// The route: axum's `MatchedPath` (with the `axum` feature) or else the
    /// request path. The path of an unmatched request is client-chosen:
    /// prefer `MatchedPath`, and a bounded `max_keys`.
    ///
    /// ```
    /// # use ratewall::http::Key;
    /// let k = Key::route();
    /// # let _ = k;
    /// ```
    pub fn route() -> Key {
        Key(KeyKind::Route)
    }

    /// One key for every request: a global limit.
    ///
    /// ```
    /// # use ratewall::http::Key;
    /// let k = Key::global();
    /// # let _ = k;
    /// ```
    pub fn global() -> Key {
        Key(KeyKind::Global)
    }

    /// All of `keys` together (per IP and route, per user and API key).
    /// Missing if any part is missing.
    ///
    /// ```
    /// # use ratewall::http::Key;
    /// let k = Key::composite([Key::ip(), Key::route()]);
    /// # let _ = k;
    /// ```
    pub fn composite(keys: impl IntoIterator<Item = Key>) -> Key {
        Key(KeyKind::Composite(keys.into_iter().collect()))
    }

    pub(super) fn needs_client_ip(&self) -> bool {
        match &self.0 {
            KeyKind::ClientIp { .. } => true,
            KeyKind::Composite(keys) => keys.iter().any(Key::needs_client_ip),
            _ => false,
        }
    }

    /// Whether the key tells clients apart (an address, a header, an
    /// extension): a concurrency limit under it is the client's own (429),
    /// not the server's (503). [`Key::global`] and [`Key::route`] do not.
    pub(super) fn names_client(&self) -> bool {
        match &self.0 {
            KeyKind::Route | KeyKind::Global => false,
            KeyKind::Composite(keys) => keys.iter().any(Key::names_client),
            _ => true,
        }
    }

    /// Whether a client can make new values of the key at will, and so fill
    /// a rule's table (`spray.rs`): a header or a path it writes, or its
    /// address (one IPv6 /48 holds 65,536 /64s). An extension is set by the
    /// application, and [`Key::global`] has one value.
    pub(super) fn client_sprays(&self) -> bool {
        match &self.0 {
            KeyKind::Extension(..) | KeyKind::Global => false,
            KeyKind::Composite(keys) => keys.iter().any(Key::client_sprays),
            _ => true,
        }
    }

    /// Whether a Redis rule's key keeps its readable name in Redis: a
    /// client address or the global key (alone or in composites of them).
    /// Anything else is client material, named by a hash there
    /// (`RedisBackendBuilder::key_secret`).
    #[cfg(feature = "redis")]
    pub(super) fn readable_in_redis(&self) -> bool {
        match &self.0 {
            KeyKind::ClientIp { .. } | KeyKind::Global => true,
            KeyKind::Composite(keys) => keys.iter().all(Key::readable_in_redis),
            _ => false,
        }
    }

    /// Whether every request has the same key ([`Key::global`], alone or
    /// in composites of it).
    pub(super) fn is_global(&self) -> bool {
        match &self.0 {
            KeyKind::Global => true,
            KeyKind::Composite(keys) => keys.iter().all(Key::is_global),
            _ => false,
        }
    }

    /// How operators see this key's values among the top offenders: a
    /// client address in full, anything else (it may be a secret) as a
    /// fingerprint.
    pub(super) fn shown(&self) -> Shown {
        match self.0 {
            KeyKind::ClientIp {
                v4_prefix,
                v6_prefix,
            } => Shown::Ip {
                v4_prefix,
                v6_prefix,
            },
            _ => Shown::Fingerprint,
        }
    }

    /// The key with the client-address prefixes given replaced (in every
    /// part of a composite).
    pub(super) fn with_prefix(self, v4: Option<u8>, v6: Option<u8>) -> Key {
        match self.0 {
            KeyKind::ClientIp {
                v4_prefix,
                v6_prefix,
            } => Key::ip_prefix(v4.unwrap_or(v4_prefix), v6.unwrap_or(v6_prefix)),
            KeyKind::Composite(keys) => Key(KeyKind::Composite(
                keys.into_iter().map(|k| k.with_prefix(v4, v6)).collect(),
            )),
            other => Key(other),
        }
    }

    /// The header of a key made of one header (tier key lists match its values).
    pub(super) fn header_name(&self) -> Option<&HeaderName> {
        match &self.0 {
            KeyKind::Header(h) => h.as_ref(),
            _ => None,
        }
    }

    pub(super) fn has_invalid_header(&self) -> bool {
        match &self.0 {
            KeyKind::Header(None) => true,
            KeyKind::Composite(keys) => keys.iter().any(Key::has_invalid_header),
            _ => false,
        }
    }

    /// The key of a request, or why it has none. The client-address and
    /// global keys are inline (a few instructions); the others, which hash,
    /// and composites, which recurse, are a call.
    #[inline]
    pub(super) fn extract(&self, req: &RequestParts<'_>, fp: &Fingerprint) -> Result<u128, Absent> {
        match &self.0 {
            KeyKind::ClientIp {
                v4_prefix,
                v6_prefix,
            } => Ok(ip_key(req.client_ip()?, *v4_prefix, *v6_prefix)),
            KeyKind::Global => Ok(0),
            _ => self.extract_hashed(req, fp),
        }
    }

    #[inline(never)]
    fn extract_hashed(&self, req: &RequestParts<'_>, fp: &Fingerprint) -> Result<u128, Absent> {
        match &self.0 {
            // Inline in `extract`, which does not come back here for them.
            KeyKind::ClientIp { .. } | KeyKind::Global => self.extract(req, fp),
            KeyKind::Header(name) => Ok(fp.of_bytes(req.header_value(name.as_ref())?.as_bytes())),
            KeyKind::Extension(_, f, _) => f(req.extensions, fp).ok_or(Absent::Value),
            KeyKind::Route => Ok(fp.of(req.route())),
            KeyKind::Composite(keys) => {
                let mut acc: u128 = 0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834;
                for k in keys {
                    let part = k.extract(req, fp)?;
                    acc = fp.of(&(acc, part));
                }
                Ok(acc)
            }
        }
    }
}

#[cfg(feature = "redis")]
impl Key {
    /// The key of a request as bytes that every instance computes alike
    /// (for a Redis limit): the masked client address as text, `h:` and the
    /// header value, `x:` and a SHA-1 of the extension's `Hash`, `r:` and
    /// the route, `*` for the global key; a composite's parts each
    /// prefixed with their length. The Redis limiter bounds the result
    /// (it hashes long, binary or braced keys).
    pub(super) fn extract_bytes(
        &self,
        req: &RequestParts<'_>,
        out: &mut Vec<u8>,
    ) -> Result<(), Absent> {
        use std::io::Write;
        match &self.0 {
            KeyKind::ClientIp {
                v4_prefix,
                v6_prefix,
            } => {
                let bits = ip_key(req.client_ip()?, *v4_prefix, *v6_prefix);
                let v6 = std::net::Ipv6Addr::from(bits);
                // Writing to a Vec cannot fail.
                let _ = match v6.to_ipv4_mapped() {
                    Some(v4) if *v4_prefix >= 32 => write!(out, "{v4}"),
                    Some(v4) => write!(out, "{v4}/{v4_prefix}"),
                    None if *v6_prefix >= 128 => write!(out, "{v6}"),
                    None => write!(out, "{v6}/{v6_prefix}"),
                };
                Ok(())
            }
            KeyKind::Header(name) => {
                let value = req.header_value(name.as_ref())?;
                out.extend_from_slice(b"h:");
                out.extend_from_slice(value.as_bytes());
                Ok(())
            }
            KeyKind::Extension(_, _, hash) => {
                let mut h = Sha1Hasher(sha1_smol::Sha1::new());
                if !hash(req.extensions, &mut h) {
                    return Err(Absent::Value);
                }
                out.extend_from_slice(b"x:");
                for b in &h.0.digest().bytes()[..16] {
                    let _ = write!(out, "{b:02x}");
                }
                Ok(())
            }
            KeyKind::Route => {
                out.extend_from_slice(b"r:");
                out.extend_from_slice(req.route().as_bytes());
                Ok(())
            }
            KeyKind::Global => {
                out.push(b'*');
                Ok(())
            }
            KeyKind::Composite(keys) => {
                let mut part = Vec::new();
                for k in keys {
                    part.clear();
                    k.extract_bytes(req, &mut part)?;
                    let _ = write!(out, "{}:", part.len());
                    out.extend_from_slice(&part);
                }
                Ok(())
            }
        }
    }
}

/// A `Hasher` over SHA-1: the same bytes give the same digest in every
/// process (unlike a seeded hasher), so instances share Redis keys.
#[cfg(feature = "redis")]
struct Sha1Hasher(sha1_smol::Sha1);

#[cfg(feature = "redis")]
impl Hasher for Sha1Hasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    fn finish(&self) -> u64 {
        let d = self.0.digest().bytes();
        u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
    }
}

/// Why a request has no key for a rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Absent {
    /// The server did not pass the peer address to the layer.
    NoPeer,
    /// The proxy chain ends in an unknown or malformed entry.
    UnknownClient,
    /// The header or extension is not there.
    Value,
    /// The header is sent more than once: which line is the key is the
    /// client's choice, so none is (an enforced rule answers 400).
    Repeated,
}

impl Absent {
    pub(super) fn describe(self) -> &'static str {
        match self {
            // What a client reads: the fix for the server goes to the log.
            Absent::NoPeer => "the server could not identify the client's address (a server set-up error)",
            Absent::UnknownClient => {
                "the client address is unknown: the proxy header's entry for the client is not an address \
                 (unknown, obfuscated or malformed), or the chain is too long"
            }
            Absent::Value => "the request does not carry the value this rule is keyed by",
            Absent::Repeated => {
                "the header this rule is keyed by is sent more than once: send it once"
            }
        }
    }
}

/// The parts of a request that keys, matchers and costs read.
#[derive(Debug)]
pub(super) struct RequestParts<'a> {
    pub(super) method: &'a Method,
    pub(super) uri: &'a Uri,
    pub(super) headers: &'a HeaderMap,
    pub(super) extensions: &'a Extensions,
    pub(super) client: Resolved,
}

impl RequestParts<'_> {
    pub(super) fn route(&self) -> &str {
        #[cfg(feature = "axum")]
        if let Some(m) = self.extensions.get::<axum::extract::MatchedPath>() {
            return m.as_str();
        }
        self.uri.path()
    }

    /// The client's address, or why there is none (both encodings).
    #[inline]
    fn client_ip(&self) -> Result<IpAddr, Absent> {
        match self.client {
            Resolved::Ip(ip) => Ok(ip),
            Resolved::NoPeer => Err(Absent::NoPeer),
            Resolved::Unknown(_) => Err(Absent::UnknownClient),
        }
    }

    /// The one value of a header (both encodings): absent when the
    /// header is not there or its name is not valid, [`Absent::Repeated`]
    /// when it is sent more than once.
    #[inline]
    fn header_value(&self, name: Option<&HeaderName>) -> Result<&HeaderValue, Absent> {
        single_header(self.headers, name.ok_or(Absent::Value)?)
    }
}

/// The one line of header `name`: [`Absent::Value`] when it is not there,
/// [`Absent::Repeated`] when it is sent more than once. Every reader of a
/// client's header that picks a key, a tier or a class goes through here,
/// so they all see the value the application sees with `headers.get`, or
/// none.
#[inline]
pub(super) fn single_header<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Result<&'h HeaderValue, Absent> {
    // No name with a second line in the whole map (its value count is its
    // name count, two counters it keeps): the first line is the only one,
    // and the walk over the name's lines is not needed.
    if headers.len() == headers.keys_len() {
        return headers.get(name).ok_or(Absent::Value);
    }
    let mut lines = headers.get_all(name).iter();
    let first = lines.next().ok_or(Absent::Value)?;
    match lines.next() {
        None => Ok(first),
        Some(_) => Err(Absent::Repeated),
    }
}

/// A rule's key for one request.
pub(super) enum RuleKey {
    Local(u128),
    #[cfg(feature = "redis")]
    Remote(Vec<u8>),
}

#[cfg(not(feature = "redis"))]
impl RuleKey {
    #[inline]
    pub(super) fn into_local(self) -> u128 {
        match self {
            RuleKey::Local(k) => k,
        }
    }
}

impl Key {
    /// The key of a request for a rule: a fingerprint for a local table,
    /// bytes for a Redis limit (`in_redis`).
    #[inline]
    pub(super) fn key_of(
        &self,
        req: &RequestParts<'_>,
        fp: &Fingerprint,
        in_redis: bool,
    ) -> Result<RuleKey, Absent> {
        #[cfg(feature = "redis")]
        if in_redis {
            let mut out = Vec::new();
            self.extract_bytes(req, &mut out)?;
            return Ok(RuleKey::Remote(out));
        }
        #[cfg(not(feature = "redis"))]
        let _ = in_redis;
        self.extract(req, fp).map(RuleKey::Local)
    }
}

/// The key of a client address: IPv4 by its first `v4_prefix` bits (after
/// unmapping), IPv6 by its first `v6_prefix` bits. Injective on what it
/// keeps: IPv4 keys live in `::ffff:0:0/96`, and an IPv6 address there is
/// unmapped to IPv4 first.
#[inline]
pub(super) fn ip_key(ip: IpAddr, v4_prefix: u8, v6_prefix: u8) -> u128 {
    match unmap(ip) {
        IpAddr::V4(v4) => u128::from(v4.to_ipv6_mapped()) & mask(96 + v4_prefix.min(32)),
        IpAddr::V6(v6) => u128::from(v6) & mask(v6_prefix.min(128)),
    }
}

/// 128-bit fingerprints of key material (header values, extension values),
/// from two independently seeded hashes. Seeds are random per layer, so
/// nobody outside can aim for a collision; for `n` distinct values the
/// chance that any two share a fingerprint is about `n² / 2^129`.
#[derive(Clone)]
pub(super) struct Fingerprint {
    a: ahash::RandomState,
    b: ahash::RandomState,
}

impl Fingerprint {
    pub(super) fn new() -> Fingerprint {
        Fingerprint {
            a: ahash::RandomState::new(),
            b: ahash::RandomState::new(),
        }
    }

    #[inline]
    pub(super) fn of<T: Hash + ?Sized>(&self, value: &T) -> u128 {
        (u128::from(self.a.hash_one(value)) << 64) | u128::from(self.b.hash_one(value))
    }

    /// [`of`](Self::of) for one byte string, written to the hashers in one
    /// call (no separate length prefix: a single value needs none, and
    /// `ahash` mixes the length into the write).
    #[inline]
    pub(super) fn of_bytes(&self, value: &[u8]) -> u128 {
        self.of(&Bytes(value))
    }
}

/// A byte string hashed with one `write`.
struct Bytes<'a>(&'a [u8]);

impl Hash for Bytes<'_> {
    #[inline]
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write(self.0);
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Fingerprint { .. }")
    }
}

#[cfg(test)]
impl<'a> RequestParts<'a> {
    /// A request from `192.0.2.1`, for the unit tests.
    pub(super) fn sample(
        method: &'a Method,
        uri: &'a Uri,
        headers: &'a HeaderMap,
        extensions: &'a Extensions,
    ) -> RequestParts<'a> {
        RequestParts {
            method,
            uri,
            headers,
            extensions,
            client: Resolved::Ip("192.0.2.1".parse().unwrap()),
        }
    }
}

#[cfg(test)]
#[path = "key_tests.rs"]
mod tests;
