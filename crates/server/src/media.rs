//! Images by URL. Fetched only when the operator names the hosts that may serve them
//! (`--allowed-media-domains`), and never from a loopback, private, link-local or other
//! non-public address unless the operator allows that too
//! (`--allow-private-media-addresses`): a client must not make the server reach what only
//! the server can reach (SSRF). Every connection, each redirect's included, goes through
//! [`GuardedResolver`], which checks the host name against the list and every address the
//! name resolves to, and hands the HTTP client only checked addresses, so a name that
//! resolves again elsewhere (DNS rebinding) is never connected to unchecked. A request's
//! fetches share one deadline (`--media-fetch-timeout`) and, together, the request body's
//! byte limit: an image by URL costs no more than the same image sent inline.

use std::error::Error as _;
use std::io::{self, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::ApiError;
use crate::images::{ImageInput, ImageSource};

/// Most redirects followed for one image (each one checked like the first address).
const MAX_REDIRECTS: usize = 3;

/// Bytes read at a time from a response (the client's departure is checked between).
const READ_CHUNK: usize = 64 << 10;

/// One entry of `--allowed-media-domains`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HostRule {
    /// `*`: any host.
    Any,
    /// `example.com`: that host only.
    Exact(String),
    /// `*.example.com`: any host under it (not `example.com` itself).
    Under(String),
}

impl HostRule {
    fn parse(entry: &str) -> Result<Self, String> {
        let entry = entry.trim().to_ascii_lowercase();
        if entry == "*" {
            return Ok(Self::Any);
        }
        let (rule, name): (fn(String) -> Self, &str) = match entry.strip_prefix("*.") {
            Some(rest) => (Self::Under, rest),
            None => (Self::Exact, entry.as_str()),
        };
        let name = name
            .trim_end_matches('.')
            .trim_start_matches('[')
            .trim_end_matches(']');
        // An IPv6 address as the resolver sees hosts (compressed); no `host:port`.
        if name.contains(':') {
            let v6: Ipv6Addr = name
                .parse()
                .map_err(|_| format!("{entry:?} is not a host name or address (give no port)"))?;
            return Ok(rule(v6.to_string()));
        }
        let valid = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b':' | b'_'));
        if !valid {
            return Err(format!(
                "{entry:?} is not a host name: give names like example.com, *.example.com or \
                 an address, without a scheme, port or path"
            ));
        }
        Ok(rule(name.to_string()))
    }

    fn allows(&self, host: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Exact(name) => host == name,
            Self::Under(name) => host
                .strip_suffix(name.as_str())
                .is_some_and(|head| head.ends_with('.')),
        }
    }
}

/// What the operator allows images to be fetched from, and within what.
#[derive(Debug, Clone)]
pub struct MediaRules {
    hosts: Vec<HostRule>,
    /// Whether loopback, private and other non-public addresses may be fetched from.
    pub allow_private: bool,
    /// Time all of one request's fetches share.
    pub timeout: Duration,
}

impl MediaRules {
    /// Rules from the flags' values; `None` when no host is allowed (no image is then
    /// fetched). An entry that is not a host name is an error.
    pub fn new(
        domains: &[String],
        allow_private: bool,
        timeout: Duration,
    ) -> Result<Option<Self>, String> {
        let hosts = domains
            .iter()
            .filter(|d| !d.trim().is_empty())
            .map(|d| HostRule::parse(d))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((!hosts.is_empty()).then_some(Self {
            hosts,
            allow_private,
            timeout,
        }))
    }

    fn allows_host(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.hosts.iter().any(|rule| rule.allows(&host))
    }
}

/// Why a fetch was refused before any connection: carried through the HTTP client's
/// error so that the client is told the reason and not a DNS failure.
#[derive(Debug)]
struct Refused(String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// The HTTP client's name resolution, checked: the host against the allowed names, each
/// address it resolves to against the address rules. Only checked addresses come out.
struct GuardedResolver(Arc<MediaRules>);

impl ureq::Resolver for GuardedResolver {
    fn resolve(&self, netloc: &str) -> io::Result<Vec<SocketAddr>> {
        let refuse = |why: String| io::Error::new(io::ErrorKind::PermissionDenied, Refused(why));
        let host = host_of(netloc);
        if !self.0.allows_host(host) {
            return Err(refuse(format!(
                "the host {host:?} is not among the media domains this server fetches from \
                 (--allowed-media-domains)"
            )));
        }
        let addresses: Vec<SocketAddr> = netloc.to_socket_addrs()?.collect();
        if !self.0.allow_private {
            if let Some(bad) = addresses.iter().find(|a| !is_public(a.ip())) {
                // The address stays in the log: told to the client, it would map the
                // operator's internal names.
                tracing::warn!(host, address = %bad.ip(), "image URL refused: a non-public address");
                return Err(refuse(format!(
                    "{host:?} resolves to a loopback, private or otherwise non-public address, \
                     which this server does not fetch from (--allow-private-media-addresses)"
                )));
            }
        }
        Ok(addresses)
    }
}

/// The host of `host:port` or `[v6]:port`.
fn host_of(netloc: &str) -> &str {
    if let Some(rest) = netloc.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    netloc.rsplit_once(':').map_or(netloc, |(host, _)| host)
}

/// Whether `ip` is a public unicast address: not loopback, private, link-local (cloud
/// metadata services live at 169.254.169.254), shared, reserved, documentation,
/// benchmarking, multicast or unspecified, and not an IPv6 form of such an IPv4 address.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_private()
        || ip.is_loopback()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_unspecified()
        || ip.is_multicast()
        || a == 0
        || (a == 100 && (64..128).contains(&b)) // shared address space (carrier NAT)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || a >= 240) // reserved
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    let s = ip.segments();
    // Only global unicast (2000::/3), less documentation (2001:db8::/32) and Teredo
    // (2001::/32, which tunnels to an IPv4 address of its own choosing); 6to4 (2002::/16)
    // by the IPv4 address it embeds.
    if s[0] & 0xe000 != 0x2000 || (s[0] == 0x2001 && (s[1] == 0x0db8 || s[1] == 0)) {
        return false;
    }
    if s[0] == 0x2002 {
        let [a, b] = s[1].to_be_bytes();
        let [c, d] = s[2].to_be_bytes();
        return is_public_v4(Ipv4Addr::new(a, b, c, d));
    }
    true
}

/// Fetches images by URL within [`MediaRules`].
pub struct MediaFetcher {
    rules: Arc<MediaRules>,
    agent: ureq::Agent,
    /// Fetches running at once, over every request: a fetch holds a blocking thread
    /// (through a name lookup no deadline reaches, too), so that many clients' images
    /// cannot take the threads every request's preparation runs on.
    slots: Arc<tokio::sync::Semaphore>,
}

/// Fetches that may run at once, over every request.
const FETCHES_AT_ONCE: usize = 16;

/// Why a request's fetches stop early: the client left, or one of them failed.
struct Stop<'a> {
    cancelled: &'a AtomicBool,
    failed: &'a AtomicBool,
}

impl Stop<'_> {
    fn now(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed) || self.failed.load(Ordering::Relaxed)
    }
}

impl MediaFetcher {
    /// A fetcher for `rules`: no proxy from the environment (a proxy would connect where
    /// the checks never looked), connections within the deadline, redirects followed
    /// here (each one's URL checked, and its host through the checked resolver).
    pub fn new(rules: MediaRules) -> Self {
        let rules = Arc::new(rules);
        let agent = ureq::AgentBuilder::new()
            .resolver(GuardedResolver(Arc::clone(&rules)))
            .try_proxy_from_env(false)
            .redirects(0)
            .timeout_connect(rules.timeout)
            .user_agent(concat!("ferrite/", env!("CARGO_PKG_VERSION")))
            .build();
        Self {
            rules,
            agent,
            slots: Arc::new(tokio::sync::Semaphore::new(FETCHES_AT_ONCE)),
        }
    }

    /// The bytes at `url` (its scheme already checked to be http or https), read until
    /// `deadline`, `budget` bytes, or `stop`.
    fn fetch(
        &self,
        field: &str,
        url: &str,
        deadline: Instant,
        budget: &AtomicUsize,
        stop: &Stop<'_>,
    ) -> Result<Vec<u8>, ApiError> {
        let failed =
            |why: String| ApiError::invalid(field, format!("fetching the image failed: {why}"));
        let mut url = url::Url::parse(url).map_err(|_| failed("the URL is not valid".into()))?;
        let mut hops = 0;
        let response = loop {
            let timeout = deadline.saturating_duration_since(Instant::now());
            if timeout.is_zero() {
                return Err(failed(timed_out(&self.rules)));
            }
            let response = match self.agent.request_url("GET", &url).timeout(timeout).call() {
                Ok(response) => response,
                Err(ureq::Error::Status(code, _)) => {
                    return Err(failed(format!("the image's server answered {code}")))
                }
                Err(ureq::Error::Transport(t)) => {
                    let refused = t
                        .source()
                        .and_then(|s| s.downcast_ref::<io::Error>())
                        .and_then(|e| e.get_ref())
                        .and_then(|e| e.downcast_ref::<Refused>());
                    if let Some(Refused(why)) = refused {
                        return Err(ApiError::invalid(field, why.clone()));
                    }
                    if Instant::now() >= deadline {
                        return Err(failed(timed_out(&self.rules)));
                    }
                    return Err(failed(transport_reason(&t)));
                }
            };
            if !(300..400).contains(&response.status()) {
                break response;
            }
            // A redirect: to an http(s) URL with a host, at most MAX_REDIRECTS of them.
            hops += 1;
            if hops > MAX_REDIRECTS {
                return Err(failed(format!("more than {MAX_REDIRECTS} redirects")));
            }
            let next = response
                .header("location")
                .and_then(|to| url.join(to).ok())
                .filter(|next| matches!(next.scheme(), "http" | "https") && next.has_host());
            url = next.ok_or_else(|| failed("a redirect to no http(s) URL".into()))?;
        };
        let mut reader = response.into_reader();
        let mut bytes = Vec::new();
        let mut chunk = vec![0u8; READ_CHUNK];
        loop {
            if stop.now() {
                return Err(failed("the request stopped".into()));
            }
            let n = match reader.read(&mut chunk) {
                Ok(0) => return Ok(bytes),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) if Instant::now() >= deadline => return Err(failed(timed_out(&self.rules))),
                Err(e) => return Err(failed(format!("reading the image: {e}"))),
            };
            let left = budget.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(n)
            });
            if left.is_err() {
                return Err(failed(
                    "the request's images by URL are larger together than a request body may be \
                     (--max-body-size)"
                        .into(),
                ));
            }
            bytes.extend_from_slice(&chunk[..n]);
        }
    }
}

fn timed_out(rules: &MediaRules) -> String {
    format!(
        "the request's images took longer than {:.1} s to fetch (--media-fetch-timeout)",
        rules.timeout.as_secs_f64()
    )
}

/// A transport failure in words that say what happened without the client's URL echoed
/// back.
fn transport_reason(t: &ureq::Transport) -> String {
    use ureq::ErrorKind as K;
    match t.kind() {
        K::Dns => "the host name does not resolve".into(),
        K::ConnectionFailed => "could not connect to the image's server".into(),
        K::InvalidUrl | K::UnknownScheme => "the URL is not a valid http(s) URL".into(),
        kind => format!("{kind}"),
    }
}

/// Replaces each image by URL in `images` with its bytes, fetched by `fetcher` (a 400
/// naming the image's field when there is none, or when a fetch fails). The fetches run
/// together off the async workers, at most [`FETCHES_AT_ONCE`] over every request,
/// within one deadline (the request answers then, whatever a fetch is still waiting for)
/// and `max_bytes` together; the first to fail, or the client leaving, stops the others.
pub async fn fetch_urls(
    images: &mut [ImageInput],
    fetcher: Option<&Arc<MediaFetcher>>,
    max_bytes: usize,
    cancelled: &Arc<AtomicBool>,
) -> Result<(), ApiError> {
    let wanted: Vec<usize> = (0..images.len())
        .filter(|&i| matches!(images[i].source, ImageSource::Url(_)))
        .collect();
    let Some(first) = wanted.first() else {
        return Ok(());
    };
    let Some(fetcher) = fetcher else {
        return Err(ApiError::invalid(
            images[*first].field.clone(),
            "this server does not fetch image URLs (its operator can allow hosts with \
             --allowed-media-domains): send the image as a `data:` URI \
             (data:image/png;base64,...)",
        ));
    };
    let started = Instant::now();
    let deadline = started + fetcher.rules.timeout;
    let budget = Arc::new(AtomicUsize::new(max_bytes));
    let failed = Arc::new(AtomicBool::new(false));
    let fetches = wanted.iter().map(|&i| {
        let (fetcher, budget) = (Arc::clone(fetcher), Arc::clone(&budget));
        let (cancelled, failed) = (Arc::clone(cancelled), Arc::clone(&failed));
        let field = images[i].field.clone();
        let url = match &images[i].source {
            ImageSource::Url(url) => url.clone(),
            ImageSource::Bytes(_) => unreachable!("only URLs were picked"),
        };
        async move {
            let slot = Arc::clone(&fetcher.slots)
                .acquire_owned()
                .await
                .map_err(|_| ApiError::Internal)?;
            let result = tokio::task::spawn_blocking(move || {
                let _slot = slot;
                let stop = Stop {
                    cancelled: &cancelled,
                    failed: &failed,
                };
                let result = fetcher.fetch(&field, &url, deadline, &budget, &stop);
                if result.is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
                result
            })
            .await;
            result.map_err(|_| ApiError::Internal)?
        }
    });
    let all = futures::future::try_join_all(fetches);
    let fetched = match tokio::time::timeout_at(deadline.into(), all).await {
        Ok(fetched) => fetched,
        Err(_) => {
            // What still runs sees the flag at its next read, or ends at its own timeouts.
            failed.store(true, Ordering::Relaxed);
            return Err(ApiError::invalid(
                images[*first].field.clone(),
                format!("fetching the image failed: {}", timed_out(&fetcher.rules)),
            ));
        }
    };
    let fetched = fetched.inspect_err(|_| failed.store(true, Ordering::Relaxed))?;
    for (&i, bytes) in wanted.iter().zip(fetched) {
        images[i].source = ImageSource::Bytes(bytes);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(domains: &[&str]) -> MediaRules {
        let domains: Vec<String> = domains.iter().map(|d| d.to_string()).collect();
        MediaRules::new(&domains, false, Duration::from_secs(1))
            .unwrap()
            .unwrap()
    }

    #[test]
    fn hosts_match_exactly_or_under_a_star() {
        let r = rules(&["Example.com.", "*.cdn.example.org", "127.0.0.1", "[::1]"]);
        for host in [
            "example.com",
            "EXAMPLE.COM",
            "example.com.",
            "a.cdn.example.org",
            "x.y.cdn.example.org",
            "127.0.0.1",
            "::1",
        ] {
            assert!(r.allows_host(host), "{host}");
        }
        for host in [
            "www.example.com",
            "example.com.evil.net",
            "cdn.example.org",
            "evilcdn.example.org",
            "127.0.0.2",
            "localhost",
        ] {
            assert!(!r.allows_host(host), "{host}");
        }
        assert!(rules(&["*"]).allows_host("anything.at.all"));
        assert!(MediaRules::new(&[], false, Duration::ZERO)
            .unwrap()
            .is_none());
        assert!(rules(&["[0:0::1]"]).allows_host("::1"));
        for bad in [
            "https://example.com",
            "example.com/images",
            "exa mple.com",
            "*.",
            "example.com:8080",
        ] {
            assert!(
                MediaRules::new(&[bad.into()], false, Duration::ZERO).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn netlocs_give_their_hosts() {
        assert_eq!(host_of("example.com:443"), "example.com");
        assert_eq!(host_of("[::1]:8080"), "::1");
        assert_eq!(host_of("10.0.0.1:80"), "10.0.0.1");
    }

    #[test]
    fn only_public_unicast_addresses_are_public() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "0.1.2.3",
            "100.64.0.1",
            "100.127.255.255",
            "192.0.0.8",
            "192.0.2.1",
            "198.18.0.1",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "fe80::1",
            "fc00::1",
            "fd12:3456::1",
            "fec0::1",
            "ff02::1",
            "64:ff9b::a9fe:a9fe",
            "2001:db8::1",
            "2001:0:4136:e378::1",
            "2002:7f00:1::1",
            "2002:a9fe:a9fe::1",
        ] {
            assert!(!is_public(private.parse().unwrap()), "{private}");
        }
        for public in [
            "1.1.1.1",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "198.20.0.1",
            "2606:4700::1111",
            "2a00:1450::1",
            "::ffff:8.8.8.8",
            "2002:0808:0808::1",
        ] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
    }

    #[test]
    fn the_resolver_refuses_hosts_not_allowed_and_private_addresses() {
        use ureq::Resolver as _;
        let guarded = GuardedResolver(Arc::new(rules(&["127.0.0.1", "localhost"])));
        let refused = |netloc: &str| {
            let e = guarded.resolve(netloc).unwrap_err();
            e.get_ref()
                .and_then(|e| e.downcast_ref::<Refused>())
                .map(|r| r.0.clone())
                .unwrap()
        };
        assert!(refused("10.0.0.1:80").contains("not among the media domains"));
        assert!(refused("127.0.0.1:80").contains("non-public"));
        assert!(refused("localhost:80").contains("non-public"));
        let open = GuardedResolver(Arc::new(MediaRules {
            allow_private: true,
            ..rules(&["127.0.0.1"])
        }));
        assert_eq!(
            open.resolve("127.0.0.1:80").unwrap(),
            vec!["127.0.0.1:80".parse().unwrap()]
        );
    }
}
