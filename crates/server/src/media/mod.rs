//! Images by URL. Fetched only when the operator names the hosts that may serve them
//! (`--allowed-media-domains`), and never from a loopback, private, link-local or other
//! non-public address unless the operator allows that too
//! (`--allow-private-media-addresses`): a client must not make the server reach what only
//! the server can reach (SSRF). Every connection, each redirect's included, is made here:
//! the host checked against the list, the name resolved once, every address checked, and
//! only those addresses connected to, so a name that resolves again elsewhere (DNS
//! rebinding) is never reached unchecked. The answer is read by `http.rs` within bounds
//! of its own. A request's fetches share one deadline (`--media-fetch-timeout`) and,
//! together, the request body's byte limit: an image by URL costs no more than the same
//! image inline.

mod address;
mod http;

use std::net::{Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::ApiError;
use crate::images::{ImageInput, ImageSource};
pub use address::is_public;

/// Most redirects followed for one image (each one checked like the first address).
const MAX_REDIRECTS: usize = 3;

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

/// The addresses `host` (an allowed host) resolves to at `port`, every one checked
/// against the address rules: a 400 naming `field` when the host is not allowed, does
/// not resolve, or resolves to a non-public address (which the client is not told: it
/// would map the operator's internal names; it is logged).
fn resolve_checked(
    rules: &MediaRules,
    field: &str,
    host: &str,
    port: u16,
) -> Result<Vec<SocketAddr>, ApiError> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if !rules.allows_host(host) {
        return Err(ApiError::invalid(
            field,
            format!(
                "the host {host:?} is not among the media domains this server fetches from \
                 (--allowed-media-domains)"
            ),
        ));
    }
    let addresses: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|_| {
            ApiError::invalid(
                field,
                "fetching the image failed: the host name does not resolve",
            )
        })?
        .collect();
    if !rules.allow_private {
        if let Some(bad) = addresses.iter().find(|a| !is_public(a.ip())) {
            tracing::warn!(host, address = %bad.ip(), "image URL refused: a non-public address");
            return Err(ApiError::invalid(
                field,
                format!(
                    "{host:?} resolves to a loopback, private or otherwise non-public address, \
                     which this server does not fetch from (--allow-private-media-addresses)"
                ),
            ));
        }
    }
    Ok(addresses)
}

/// Fetches images by URL within [`MediaRules`].
pub struct MediaFetcher {
    rules: Arc<MediaRules>,
    /// Fetches running at once, over every request: a fetch holds a blocking thread
    /// (through a name lookup no deadline reaches, too), so that many clients' images
    /// cannot take the threads every request's preparation runs on.
    slots: Arc<tokio::sync::Semaphore>,
}

/// Fetches that may run at once, over every request.
const FETCHES_AT_ONCE: usize = 16;

impl MediaFetcher {
    /// A fetcher for `rules`.
    pub fn new(rules: MediaRules) -> Self {
        Self {
            rules: Arc::new(rules),
            slots: Arc::new(tokio::sync::Semaphore::new(FETCHES_AT_ONCE)),
        }
    }

    /// The bytes at `url`, following at most [`MAX_REDIRECTS`] redirects (each to an
    /// http(s) URL, its host and addresses checked again), read until `deadline`,
    /// `budget` bytes, or `stop`.
    fn fetch(
        &self,
        field: &str,
        url: &str,
        deadline: Instant,
        budget: &AtomicUsize,
        stop: &dyn Fn() -> bool,
    ) -> Result<Vec<u8>, ApiError> {
        let failed =
            |why: String| ApiError::invalid(field, format!("fetching the image failed: {why}"));
        let mut url = url::Url::parse(url).map_err(|_| failed("the URL is not valid".into()))?;
        let bounds = http::Bounds {
            deadline,
            budget,
            stop,
        };
        for _ in 0..=MAX_REDIRECTS {
            let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
                return Err(failed("the URL is not a valid http(s) URL".into()));
            };
            if !matches!(url.scheme(), "http" | "https") {
                return Err(failed("the URL is not a valid http(s) URL".into()));
            }
            let addresses = resolve_checked(&self.rules, field, host, port)?;
            let answer = http::get(&url, &addresses, &bounds).map_err(|e| match e {
                http::HttpError::TimedOut => failed(timed_out(&self.rules)),
                http::HttpError::TooLarge => failed(
                    "the request's images by URL are larger together than a request body may \
                     be (--max-body-size)"
                        .into(),
                ),
                http::HttpError::Stopped => failed("the request stopped".into()),
                http::HttpError::Failed(why) => failed(why),
            })?;
            match answer.status {
                200..=299 => return Ok(answer.body),
                300..=399 => {
                    let next = answer
                        .location
                        .and_then(|to| url.join(&to).ok())
                        .filter(|next| {
                            matches!(next.scheme(), "http" | "https") && next.has_host()
                        });
                    url = next.ok_or_else(|| failed("a redirect to no http(s) URL".into()))?;
                }
                code => return Err(failed(format!("the image's server answered {code}"))),
            }
        }
        Err(failed(format!("more than {MAX_REDIRECTS} redirects")))
    }
}

fn timed_out(rules: &MediaRules) -> String {
    format!(
        "the request's images took longer than {:.1} s to fetch (--media-fetch-timeout)",
        rules.timeout.as_secs_f64()
    )
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
    let deadline = Instant::now() + fetcher.rules.timeout;
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
                let stop = || cancelled.load(Ordering::Relaxed) || failed.load(Ordering::Relaxed);
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
    fn resolving_refuses_hosts_not_allowed_and_private_addresses() {
        let strict = rules(&["127.0.0.1", "localhost", "[::1]"]);
        let refused = |host: &str| match resolve_checked(&strict, "images[0]", host, 80) {
            Err(ApiError::InvalidRequest { param, message }) => {
                assert_eq!(param.as_deref(), Some("images[0]"));
                message
            }
            other => panic!("{host}: {other:?}"),
        };
        assert!(refused("10.0.0.1").contains("not among the media domains"));
        for host in ["127.0.0.1", "localhost", "[::1]"] {
            let message = refused(host);
            assert!(
                message.contains("non-public") && !message.contains("127.0.0.1:"),
                "{message}"
            );
        }
        let open = MediaRules {
            allow_private: true,
            ..rules(&["127.0.0.1"])
        };
        assert_eq!(
            resolve_checked(&open, "images[0]", "127.0.0.1", 80).unwrap(),
            vec!["127.0.0.1:80".parse::<SocketAddr>().unwrap()]
        );
    }
}
