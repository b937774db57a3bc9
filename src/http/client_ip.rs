//! Who a request comes from: the client's IP address, behind trusted
//! proxies, walked from the right. The keys rules count requests under are
//! in `key.rs`.
//!
//! # The client address
//!
//! [`ClientIp`] starts from the TCP peer (axum's `ConnectInfo<SocketAddr>`
//! with the `axum` feature, tonic's `TcpConnectInfo` with the `tonic`
//! feature, a `SocketAddr` request extension, or a lookup function of your
//! own). When the peer is a
//! trusted proxy, the `X-Forwarded-For` (or RFC 7239 `Forwarded`) entries
//! are walked **from the right**, past trusted hops; the first untrusted
//! address is the client. The left-most entry is never believed just
//! because it is left-most: any client can write it. An entry that is not an
//! address (`unknown`, an obfuscated `_id`, garbage) stops the walk and the
//! client is unknown: it is not skipped, because the hop that wrote it is
//! the one we would have to trust next. An unknown client remembers the
//! nearest trusted hop (the address the walk last passed, or the peer),
//! which a rule may key by instead ([`UnknownClient`](super::UnknownClient)).

use http::header::{HeaderMap, HeaderName};
use http::Extensions;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

/// The most list entries a walk reads before it gives up (the client is
/// then unknown). Real chains are a handful of hops long; the cap bounds the
/// work a hostile header can cause.
pub const MAX_HOPS: usize = 32;

/// The longest single list entry that is parsed (longer ones are garbage
/// and stop the walk): `[v6 with zone]:port` fits easily.
const MAX_NODE_LEN: usize = 96;

/// A network: an address and a prefix length, such as `10.0.0.0/8` or
/// `2001:db8::/32`. A bare address is a network of one.
///
/// # Example
///
/// ```
/// use ratewall::http::Cidr;
///
/// let net: Cidr = "10.0.0.0/8".parse()?;
/// assert!(net.contains("10.1.2.3".parse()?));
/// assert!(net.contains("::ffff:10.9.9.9".parse()?)); // IPv4-mapped IPv6 is unmapped first
/// assert!(!net.contains("11.0.0.1".parse()?));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    /// The network in the 128-bit space where IPv4 sits at `::ffff:0:0/96`.
    bits: u128,
    /// The prefix length in that space (IPv4 lengths plus 96).
    len: u8,
}

impl Cidr {
    /// The network of `addr` with the first `prefix` bits (at most 32 for
    /// IPv4, 128 for IPv6). `None` if the prefix is too long.
    ///
    /// ```
    /// # use ratewall::http::Cidr;
    /// # use std::net::{IpAddr, Ipv4Addr};
    /// let net = Cidr::new(IpAddr::V4(Ipv4Addr::new(192, 168, 0, 0)), 16).unwrap();
    /// assert!(net.contains("192.168.7.7".parse().unwrap()));
    /// assert!(Cidr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 33).is_none());
    /// ```
    pub fn new(addr: IpAddr, prefix: u8) -> Option<Cidr> {
        let addr = unmap(addr);
        let len = match addr {
            IpAddr::V4(_) if prefix <= 32 => prefix + 96,
            IpAddr::V6(_) if prefix <= 128 => prefix,
            _ => return None,
        };
        Some(Cidr {
            bits: to_bits(addr) & mask(len),
            len,
        })
    }

    /// Whether `ip` is in the network (IPv4-mapped IPv6 counts as IPv4).
    ///
    /// ```
    /// # use ratewall::http::Cidr;
    /// let net: Cidr = "2001:db8::/32".parse().unwrap();
    /// assert!(net.contains("2001:db8:1::5".parse().unwrap()));
    /// ```
    pub fn contains(&self, ip: IpAddr) -> bool {
        to_bits(unmap(ip)) & mask(self.len) == self.bits
    }
}

impl fmt::Debug for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v6 = Ipv6Addr::from(self.bits);
        // Only an IPv4 network has mapped bits (a shorter prefix clears
        // some of the `ffff`), so the length check never fails; it keeps
        // the subtraction from underflowing without a guard to trust.
        match (v6.to_ipv4_mapped(), self.len.checked_sub(96)) {
            (Some(v4), Some(len)) => write!(f, "{v4}/{len}"),
            _ => write!(f, "{v6}/{}", self.len),
        }
    }
}

/// A network that does not parse as `address` or `address/prefix`.
///
/// ```
/// # use ratewall::http::Cidr;
/// let err = "10.0.0.0/40".parse::<Cidr>().unwrap_err();
/// assert!(err.to_string().contains("10.0.0.0/40"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CidrParseError {
    input: String,
}

impl fmt::Display for CidrParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` is not a network: write an address with an optional prefix length, \
             such as `10.0.0.0/8`, `192.0.2.7` or `2001:db8::/32` (at most /32 for IPv4, /128 for IPv6)",
            self.input
        )
    }
}

impl std::error::Error for CidrParseError {}

impl FromStr for Cidr {
    type Err = CidrParseError;

    fn from_str(s: &str) -> Result<Cidr, CidrParseError> {
        let err = || CidrParseError {
            input: s.to_owned(),
        };
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => {
                let p: u8 = p.parse().map_err(|_| err())?;
                (a.parse::<IpAddr>().map_err(|_| err())?, Some(p))
            }
            None => (s.parse::<IpAddr>().map_err(|_| err())?, None),
        };
        let prefix = prefix.unwrap_or(match unmap(addr) {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        });
        // A written IPv4-mapped network ("::ffff:10.0.0.0/104") counts in
        // IPv6 lengths; convert it to its IPv4 length.
        let prefix = match (addr, unmap(addr)) {
            (IpAddr::V6(_), IpAddr::V4(_)) if s.contains('/') => {
                prefix.checked_sub(96).ok_or_else(err)?
            }
            _ => prefix,
        };
        Cidr::new(addr, prefix).ok_or_else(err)
    }
}

/// IPv4-mapped IPv6 (`::ffff:a.b.c.d`) becomes the IPv4 address it carries.
#[inline]
pub(super) fn unmap(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// The address in the 128-bit space (IPv4 at `::ffff:0:0/96`).
#[inline]
fn to_bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(v4.to_ipv6_mapped()),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The mask of the first `len` bits (`len` at most 128, as every `Cidr`
/// and prefix holds). At 128 the shift is 0: no separate case is needed.
#[inline]
pub(super) fn mask(len: u8) -> u128 {
    match len {
        0 => 0,
        l => u128::MAX << (128 - u32::from(l)),
    }
}

/// Which list header carries the chain of proxies.
///
/// ```
/// use ratewall::http::{ClientIp, ProxyHeader};
///
/// let ip = ClientIp::behind_proxies(["10.0.0.0/8".parse()?]).header(ProxyHeader::Forwarded);
/// println!("{ip:?}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (the default).
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for="[2001:db8::1]:443"`.
    Forwarded,
}

impl ProxyHeader {
    fn name(self) -> HeaderName {
        match self {
            ProxyHeader::XForwardedFor => HeaderName::from_static("x-forwarded-for"),
            ProxyHeader::Forwarded => http::header::FORWARDED,
        }
    }
}

#[derive(Clone, Debug)]
enum Trust {
    /// Only the TCP peer.
    Peer,
    /// Peers and hops inside these networks are proxies.
    Networks(Vec<Cidr>),
    /// Exactly this many proxies stand in front of the server.
    Hops(usize),
    /// One header set by a CDN, believed only from these peers.
    Single(HeaderName, Vec<Cidr>),
}

/// How the layer finds the client's IP address.
///
/// The default is the TCP peer, and nothing in the request's headers is
/// believed. Behind proxies, say which peers are proxies (by network or by
/// count): the chain is then walked from the right.
///
/// # Example
///
/// ```
/// use ratewall::http::ClientIp;
///
/// // A load balancer in 10.0.0.0/8 in front of the server.
/// let ip = ClientIp::behind_proxies(["10.0.0.0/8".parse()?]);
/// // Or: exactly two proxies, whatever their addresses.
/// let hops = ClientIp::behind_hops(2);
/// // Or: Cloudflare's single header, believed only from Cloudflare's ranges.
/// let cdn = ClientIp::single_header("cf-connecting-ip", ["173.245.48.0/20".parse()?]);
/// # let _ = (ip, hops, cdn);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct ClientIp {
    trust: Trust,
    header: ProxyHeader,
    peer_fn: Option<PeerFn>,
    /// The networks the TCP peer must be in for any header to be read
    /// ([`ClientIp::from_peers`]); `None`: no such check.
    peers: Option<Vec<Cidr>>,
}

/// A custom peer lookup ([`ClientIp::peer_from`]).
type PeerFn = Arc<dyn Fn(&Extensions) -> Option<IpAddr> + Send + Sync>;

impl Default for ClientIp {
    fn default() -> Self {
        ClientIp::peer()
    }
}

impl fmt::Debug for ClientIp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientIp")
            .field("trust", &self.trust)
            .field("header", &self.header)
            .field("custom_peer", &self.peer_fn.is_some())
            .field("peers", &self.peers)
            .finish()
    }
}

/// What the walk found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Resolved {
    /// The client's address.
    Ip(IpAddr),
    /// No peer address reached the layer: the server is not set up to pass it.
    NoPeer,
    /// The chain holds an unknown, obfuscated or malformed entry where the
    /// client should be, is longer than [`MAX_HOPS`], or a single header
    /// from a trusted peer is absent or repeated. The address is the
    /// nearest trusted hop: the one that wrote the entry (or the peer).
    Unknown(IpAddr),
}

impl ClientIp {
    /// The TCP peer, and nothing from the headers (the default).
    ///
    /// ```
    /// # use ratewall::http::ClientIp;
    /// let ip = ClientIp::peer();
    /// # let _ = ip;
    /// ```
    pub fn peer() -> ClientIp {
        ClientIp {
            trust: Trust::Peer,
            header: ProxyHeader::XForwardedFor,
            peer_fn: None,
            peers: None,
        }
    }

    /// Proxies are the peers and hops inside `networks`: the chain is
    /// walked from the right past them, and the first address outside is
    /// the client. A peer outside the networks is the client, whatever its
    /// headers say.
    ///
    /// ```
    /// # use ratewall::http::ClientIp;
    /// let ip = ClientIp::behind_proxies(["10.0.0.0/8".parse()?, "fd00::/8".parse()?]);
    /// # let _ = ip;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn behind_proxies(networks: impl IntoIterator<Item = Cidr>) -> ClientIp {
        ClientIp {
            trust: Trust::Networks(networks.into_iter().collect()),
            ..ClientIp::peer()
        }
    }

    /// Exactly `hops` proxies stand in front of the server (the peer is the
    /// nearest): the client is the `hops`-th entry from the right. With
    /// fewer entries, the client is the nearest address the server can
    /// vouch for, as nginx's realip and Express's trust-proxy do: the
    /// left-most entry (written by a proxy of ours), or with none (a direct
    /// request, a health check) the peer. `0` means the peer.
    ///
    /// **Say which peers the proxies are** with
    /// [`from_peers`](Self::from_peers). A hop count alone believes the
    /// chain from *every* peer: if the server can be reached without the
    /// proxies (a public address, another listener, a neighbour in the
    /// same network), a client that connects directly and writes
    /// `X-Forwarded-For: <victim>` is counted as the victim, and passes an
    /// [`allow`](super::RateLimitBuilder::allow) list as any address it
    /// names. Without peers the layer warns once when it is built; a hop
    /// count alone is right only where nothing but the proxies can connect.
    ///
    /// ```
    /// # use ratewall::http::ClientIp;
    /// // One load balancer, in 10.0.0.0/8: a direct client is keyed by its
    /// // own address, whatever its headers say.
    /// let ip = ClientIp::behind_hops(1).from_peers(["10.0.0.0/8".parse()?]);
    /// # let _ = ip;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn behind_hops(hops: usize) -> ClientIp {
        ClientIp {
            trust: Trust::Hops(hops),
            ..ClientIp::peer()
        }
    }

    /// One header holding the client's address (a CDN's, such as
    /// `CF-Connecting-IP`), believed only when the peer is inside
    /// `networks`. An invalid header name never matches any request.
    ///
    /// ```
    /// # use ratewall::http::ClientIp;
    /// let ip = ClientIp::single_header("cf-connecting-ip", ["173.245.48.0/20".parse()?]);
    /// # let _ = ip;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn single_header(name: &str, networks: impl IntoIterator<Item = Cidr>) -> ClientIp {
        let name = HeaderName::from_bytes(name.as_bytes())
            // An invalid name can never be present in a request.
            .unwrap_or(HeaderName::from_static("x-ratewall-invalid-header-name"));
        ClientIp {
            trust: Trust::Single(name, networks.into_iter().collect()),
            ..ClientIp::peer()
        }
    }

    /// Headers are read only from a TCP peer inside `networks` (the
    /// proxies' addresses): a request from any other peer is that peer's,
    /// and its `X-Forwarded-For`, `Forwarded` or single header is ignored,
    /// so a client that reaches the server directly can neither take
    /// another client's key nor pass the allow list under an address it
    /// wrote. Made for [`behind_hops`](Self::behind_hops), which otherwise
    /// trusts every peer; [`behind_proxies`](Self::behind_proxies) and
    /// [`single_header`](Self::single_header) already check the peer
    /// against their networks, and both checks then apply. Given more than
    /// once, the last list counts.
    ///
    /// Only the TCP peer is checked: with two or more hops, a client that
    /// can reach the nearest proxy without passing the outer ones (a load
    /// balancer reachable around the CDN) still writes the entries those
    /// would have written. Where the outer proxies' networks are known,
    /// [`behind_proxies`](Self::behind_proxies) checks every hop.
    ///
    /// ```
    /// # use ratewall::http::ClientIp;
    /// // Two proxies (a CDN, then our load balancers in 10.0.0.0/8): only
    /// // the load balancers may speak for a client.
    /// let ip = ClientIp::behind_hops(2).from_peers(["10.0.0.0/8".parse()?, "fd00::/8".parse()?]);
    /// # let _ = ip;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_peers(mut self, networks: impl IntoIterator<Item = Cidr>) -> ClientIp {
        self.peers = Some(networks.into_iter().collect());
        self
    }

    /// Which list header to walk (`X-Forwarded-For` by default).
    ///
    /// ```
    /// # use ratewall::http::{ClientIp, ProxyHeader};
    /// let ip = ClientIp::behind_hops(1).header(ProxyHeader::Forwarded);
    /// # let _ = ip;
    /// ```
    pub fn header(mut self, header: ProxyHeader) -> ClientIp {
        self.header = header;
        self
    }

    /// Where the TCP peer's address comes from, when it is not in a
    /// `SocketAddr` request extension, axum's `ConnectInfo<SocketAddr>`
    /// (feature `axum`) or tonic's `TcpConnectInfo` (feature `tonic`): for
    /// example tonic's `TlsConnectInfo<TcpConnectInfo>` behind TLS, or a
    /// Unix-socket server's own type. Looked up first; when it returns
    /// `None` the built-in sources are tried.
    ///
    /// ```
    /// # use ratewall::http::ClientIp;
    /// # use std::net::IpAddr;
    /// #[derive(Clone)]
    /// struct Peer(IpAddr);
    /// let ip = ClientIp::peer().peer_from(|ext| ext.get::<Peer>().map(|p| p.0));
    /// // Closures may capture: here, a fallback address from configuration.
    /// let fallback: IpAddr = "192.0.2.1".parse().unwrap();
    /// let ip2 = ClientIp::peer().peer_from(move |ext| Some(ext.get::<Peer>().map_or(fallback, |p| p.0)));
    /// # let _ = (ip, ip2);
    /// ```
    pub fn peer_from(
        mut self,
        lookup: impl Fn(&Extensions) -> Option<IpAddr> + Send + Sync + 'static,
    ) -> ClientIp {
        self.peer_fn = Some(Arc::new(lookup));
        self
    }

    /// Whether any proxy is trusted (for the misconfiguration warning).
    pub(super) fn trusts_proxies(&self) -> bool {
        !matches!(self.trust, Trust::Peer)
    }

    /// A hop count that believes the chain from any peer (no
    /// [`from_peers`](Self::from_peers)): the build warns.
    pub(super) fn hops_from_any_peer(&self) -> bool {
        matches!(self.trust, Trust::Hops(n) if n > 0) && self.peers.is_none()
    }

    /// The TCP peer's address, unmapped.
    #[inline]
    pub(super) fn peer_addr(&self, ext: &Extensions) -> Option<IpAddr> {
        if let Some(f) = &self.peer_fn {
            if let Some(ip) = f(ext) {
                return Some(unmap(ip));
            }
        }
        #[cfg(feature = "axum")]
        if let Some(info) = ext.get::<axum::extract::ConnectInfo<SocketAddr>>() {
            return Some(unmap(info.0.ip()));
        }
        #[cfg(feature = "tonic")]
        if let Some(addr) = ext
            .get::<tonic::transport::server::TcpConnectInfo>()
            .and_then(|info| info.remote_addr())
        {
            return Some(unmap(addr.ip()));
        }
        ext.get::<SocketAddr>().map(|a| unmap(a.ip()))
    }

    /// The client's address for a request with these headers and
    /// extensions. Allocates nothing.
    #[inline]
    pub(super) fn resolve(&self, headers: &HeaderMap, ext: &Extensions) -> Resolved {
        // The default, no proxy trusted: the peer, whatever the headers say
        // (and whichever networks `from_peers` named). Inline: the layer's
        // every request asks, and most layers trust no proxy.
        if let Trust::Peer = self.trust {
            return match self.peer_addr(ext) {
                Some(peer) => Resolved::Ip(peer),
                None => Resolved::NoPeer,
            };
        }
        self.resolve_behind_proxies(headers, ext)
    }

    /// [`resolve`](Self::resolve) when some proxy is trusted.
    #[inline(never)]
    fn resolve_behind_proxies(&self, headers: &HeaderMap, ext: &Extensions) -> Resolved {
        let Some(peer) = self.peer_addr(ext) else {
            return Resolved::NoPeer;
        };
        if let Some(peers) = &self.peers {
            // Not a proxy of ours: the peer is the client, whatever it wrote.
            if !peers.iter().any(|n| n.contains(peer)) {
                return Resolved::Ip(peer);
            }
        }
        match &self.trust {
            Trust::Peer => Resolved::Ip(peer),
            Trust::Networks(nets) => {
                let trusted = |ip: IpAddr| nets.iter().any(|n| n.contains(ip));
                if !trusted(peer) {
                    return Resolved::Ip(peer);
                }
                // A trusted address that sent no chain is itself the client
                // (an internal caller); otherwise the left-most trusted hop
                // is, when every entry is trusted.
                let mut last = peer;
                for node in Chain::new(headers, self.header).take(MAX_HOPS + 1) {
                    match node {
                        Node::Ip(ip) if trusted(ip) => last = ip,
                        Node::Ip(ip) => return Resolved::Ip(ip),
                        Node::Unknown | Node::TooLong => return Resolved::Unknown(last),
                    }
                }
                Resolved::Ip(last)
            }
            Trust::Hops(0) => Resolved::Ip(peer),
            Trust::Hops(hops) => {
                // Every entry before the `hops`-th was written by a proxy
                // of ours: the last one passed is the nearest vouched-for
                // address (the peer when there is none).
                let mut last = peer;
                for (i, node) in Chain::new(headers, self.header)
                    .take(MAX_HOPS + 1)
                    .enumerate()
                {
                    match node {
                        Node::Ip(ip) if i + 1 == *hops => return Resolved::Ip(ip),
                        Node::Ip(ip) => last = ip,
                        Node::Unknown | Node::TooLong => return Resolved::Unknown(last),
                    }
                }
                Resolved::Ip(last)
            }
            Trust::Single(name, nets) => {
                if !nets.iter().any(|n| n.contains(peer)) {
                    return Resolved::Ip(peer);
                }
                let mut values = headers.get_all(name).iter();
                match (values.next(), values.next()) {
                    (Some(v), None) => match parse_node(v.as_bytes().trim_ascii()) {
                        Some(ip) => Resolved::Ip(unmap(ip)),
                        None => Resolved::Unknown(peer),
                    },
                    // Absent, or sent twice: nothing to believe.
                    _ => Resolved::Unknown(peer),
                }
            }
        }
    }
}

/// One entry of the chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    Ip(IpAddr),
    /// `unknown`, an obfuscated identifier, or anything that is not an address.
    Unknown,
    /// The walk passed [`MAX_HOPS`] entries.
    TooLong,
}

/// The entries of every line of a list header, from the right. Empty list
/// elements are skipped, as HTTP's list syntax says.
struct Chain<'a> {
    lines: http::header::ValueIter<'a, http::HeaderValue>,
    current: Elements<'a>,
    header: ProxyHeader,
    seen: usize,
}

impl<'a> Chain<'a> {
    fn new(headers: &'a HeaderMap, header: ProxyHeader) -> Chain<'a> {
        Chain {
            lines: headers.get_all(header.name()).into_iter(),
            current: Elements::new(b""),
            header,
            seen: 0,
        }
    }
}

impl Iterator for Chain<'_> {
    type Item = Node;

    fn next(&mut self) -> Option<Node> {
        loop {
            if let Some(el) = self.current.next() {
                let el = match el {
                    Some(el) => el.trim_ascii(),
                    None => return Some(Node::Unknown),
                };
                if el.is_empty() {
                    continue;
                }
                self.seen += 1;
                if self.seen > MAX_HOPS {
                    return Some(Node::TooLong);
                }
                let node = match self.header {
                    ProxyHeader::XForwardedFor => parse_node(el),
                    ProxyHeader::Forwarded => forwarded_for(el).and_then(parse_node),
                };
                return Some(node.map_or(Node::Unknown, |ip| Node::Ip(unmap(ip))));
            }
            let line = self.lines.next_back()?;
            self.current = Elements::new(line.as_bytes());
        }
    }
}

/// The comma-separated elements of one line, from the right, with commas
/// inside quoted strings kept. `Some(None)` marks a malformed element (an
/// unbalanced quote or a backslash escape, which no address needs).
struct Elements<'a> {
    rest: &'a [u8],
    done: bool,
}

impl<'a> Elements<'a> {
    fn new(line: &'a [u8]) -> Elements<'a> {
        Elements {
            rest: line,
            done: line.is_empty(),
        }
    }
}

impl<'a> Iterator for Elements<'a> {
    type Item = Option<&'a [u8]>;

    fn next(&mut self) -> Option<Option<&'a [u8]>> {
        if self.done {
            return None;
        }
        let mut quoted = false;
        for i in (0..self.rest.len()).rev() {
            match self.rest[i] {
                b'"' => quoted = !quoted,
                b'\\' => {
                    self.done = true;
                    return Some(None);
                }
                b',' if !quoted => {
                    let el = &self.rest[i + 1..];
                    self.rest = &self.rest[..i];
                    return Some(Some(el));
                }
                _ => {}
            }
        }
        self.done = true;
        if quoted {
            return Some(None);
        }
        Some(Some(self.rest))
    }
}

/// The `for=` value of one `Forwarded` element, unquoted. `None` when the
/// element has none (a proxy that did not say who it saw).
fn forwarded_for(el: &[u8]) -> Option<&[u8]> {
    for pair in el.split(|&b| b == b';') {
        let pair = pair.trim_ascii();
        let Some(eq) = pair.iter().position(|&b| b == b'=') else {
            continue;
        };
        let (name, value) = (pair[..eq].trim_ascii(), pair[eq + 1..].trim_ascii());
        if name.eq_ignore_ascii_case(b"for") {
            return Some(match value {
                [b'"', inner @ .., b'"'] => inner,
                v => v,
            });
        }
    }
    None
}

/// An address from one chain entry: `192.0.2.1`, `192.0.2.1:8080`,
/// `2001:db8::1`, `[2001:db8::1]`, `[2001:db8::1]:443`, with an optional
/// zone id (`fe80::1%eth0`, dropped). `unknown`, obfuscated identifiers
/// (`_hidden`) and anything else give `None`.
pub(super) fn parse_node(node: &[u8]) -> Option<IpAddr> {
    if node.is_empty() || node.len() > MAX_NODE_LEN {
        return None;
    }
    let s = std::str::from_utf8(node).ok()?;
    if let Some(rest) = s.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(valid_port)) {
            return None;
        }
        return parse_v6(inside).map(IpAddr::V6);
    }
    match s.bytes().filter(|&b| b == b':').count() {
        0 => s.parse::<Ipv4Addr>().ok().map(IpAddr::V4),
        1 => {
            let (host, port) = s.split_once(':')?;
            if !valid_port(port) {
                return None;
            }
            host.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
        }
        _ => parse_v6(s).map(IpAddr::V6),
    }
}

fn parse_v6(s: &str) -> Option<Ipv6Addr> {
    let addr = match s.split_once('%') {
        // A zone id names an interface of the sender; the address is the key.
        Some((a, zone)) if !zone.is_empty() => a,
        Some(_) => return None,
        None => s,
    };
    addr.parse().ok()
}

/// A port: 1 to 5 digits, or an RFC 7239 obfuscated port (`_abc`).
fn valid_port(p: &str) -> bool {
    let b = p.as_bytes();
    match b.first() {
        Some(b'_') => {
            b.len() > 1
                && b[1..]
                    .iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
        }
        Some(_) => b.len() <= 5 && b.iter().all(u8::is_ascii_digit),
        None => false,
    }
}

#[cfg(test)]
#[path = "client_ip_tests.rs"]
mod tests;
