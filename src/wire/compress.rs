//! Response compression's rules (DESIGN §10): which coding a client gets,
//! which responses are compressed, and what their heads become. Pure rules;
//! the streaming encoders are in [`encoder`].

pub mod encoder;

/// A content coding shardgate can compress with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coding {
    Zstd,
    Br,
    Gzip,
}

impl Coding {
    /// Its token in `Content-Encoding`, `Accept-Encoding` and the
    /// configuration.
    pub fn token(self) -> &'static str {
        match self {
            Coding::Zstd => "zstd",
            Coding::Br => "br",
            Coding::Gzip => "gzip",
        }
    }

    /// The coding a token names (ASCII case ignored; `x-gzip` is gzip,
    /// RFC 9110 §8.4.1.3).
    pub fn of_token(token: &[u8]) -> Option<Coding> {
        let is = |name: &str| token.eq_ignore_ascii_case(name.as_bytes());
        match () {
            _ if is("zstd") => Some(Coding::Zstd),
            _ if is("br") => Some(Coding::Br),
            _ if is("gzip") || is("x-gzip") => Some(Coding::Gzip),
            _ => None,
        }
    }
}

/// One of `compression.types`: a media type, or `major/*`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypePattern {
    major: String,
    /// `None`: any subtype.
    minor: Option<String>,
}

impl TypePattern {
    /// `text/html`, `text/*`; lowercased. Anything else is refused with
    /// the reason.
    pub fn parse(text: &str) -> Result<TypePattern, &'static str> {
        let token = |s: &str| !s.is_empty() && s.bytes().all(is_token_byte);
        let (major, minor) = text
            .split_once('/')
            .ok_or("a media type is `type/subtype` or `type/*`")?;
        if !token(major) || major == "*" {
            return Err("a media type's type is a token, not `*`");
        }
        let minor = match minor {
            "*" => None,
            m if token(m) => Some(m.to_ascii_lowercase()),
            _ => return Err("a media type's subtype is a token or `*`"),
        };
        Ok(TypePattern {
            major: major.to_ascii_lowercase(),
            minor,
        })
    }

    /// Whether the media type of a `Content-Type` value (its parameters
    /// aside) is this pattern's.
    pub fn matches(&self, content_type: &[u8]) -> bool {
        let essence = content_type
            .split(|&b| b == b';')
            .next()
            .unwrap_or_default();
        let essence = essence.trim_ascii();
        let Some(slash) = essence.iter().position(|&b| b == b'/') else {
            return false;
        };
        let (major, minor) = (&essence[..slash], &essence[slash + 1..]);
        major.eq_ignore_ascii_case(self.major.as_bytes())
            && self
                .minor
                .as_ref()
                .is_none_or(|m| minor.eq_ignore_ascii_case(m.as_bytes()))
    }
}

/// RFC 9110 `tchar`.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The coding a client gets: of `algorithms` (the preference order), the
/// one its `Accept-Encoding` values give the highest weight above zero,
/// the earlier on a tie; `None` if it accepts none of them (or sent no
/// `Accept-Encoding`: identity, as nginx and Caddy read it). A coding
/// named outright takes its own weight; one not named, that of `*`.
/// Elements that do not parse are ignored.
pub fn negotiate<'a>(
    algorithms: &[Coding],
    values: impl Iterator<Item = &'a [u8]>,
) -> Option<Coding> {
    // Weights in thousandths, by `Coding` (`None`: not named).
    let mut named: [Option<u16>; 3] = [None; 3];
    let mut any: Option<u16> = None;
    for element in values.flat_map(|v| v.split(|&b| b == b',')) {
        let mut parts = element.split(|&b| b == b';');
        let token = parts.next().unwrap_or_default().trim_ascii();
        let mut weight = Some(1000);
        for param in parts {
            let param = param.trim_ascii();
            if let Some(q) = param
                .strip_prefix(b"q=")
                .or_else(|| param.strip_prefix(b"Q="))
            {
                weight = qvalue(q);
            }
        }
        let Some(weight) = weight else {
            continue;
        };
        if token == b"*" {
            any = Some(weight);
        } else if let Some(coding) = Coding::of_token(token) {
            named[coding as usize] = Some(weight);
        }
    }
    let weight = |c: Coding| named[c as usize].or(any).unwrap_or(0);
    let mut best: Option<(Coding, u16)> = None;
    for &coding in algorithms {
        let w = weight(coding);
        if w > 0 && best.is_none_or(|(_, b)| w > b) {
            best = Some((coding, w));
        }
    }
    best.map(|(coding, _)| coding)
}

/// A `qvalue` (RFC 9110 §12.4.2) in thousandths: `0`, `1`, `0.5`,
/// `1.000`; `None` if it is none.
fn qvalue(text: &[u8]) -> Option<u16> {
    let (whole, fraction) = match text.iter().position(|&b| b == b'.') {
        Some(dot) => (&text[..dot], &text[dot + 1..]),
        None => (text, &b""[..]),
    };
    if fraction.len() > 3 || !fraction.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let thousandths = fraction
        .iter()
        .chain(std::iter::repeat(&b'0'))
        .take(3)
        .fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
    match whole {
        b"0" => Some(thousandths),
        b"1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

/// What a response is, as compression asks.
#[derive(Clone, Copy, Debug, Default)]
pub struct ResponseFacts<'a> {
    /// The answer to a HEAD request.
    pub head_request: bool,
    pub status: u16,
    /// Its `Content-Type`, if it has one.
    pub content_type: Option<&'a [u8]>,
    /// It has a `Content-Encoding` other than `identity`.
    pub encoded: bool,
    /// Its declared length, if it has one.
    pub content_length: Option<u64>,
    /// `Cache-Control: no-transform`.
    pub no_transform: bool,
    /// It has a `Content-Range` (a part of a representation).
    pub ranged: bool,
}

/// What to do with a response's body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Leave it as it is.
    Leave,
    /// Leave it, but say it varies with `Accept-Encoding` (another client
    /// would have got it compressed: a cache must not hand this one to it).
    LeaveVaried,
    /// Compress it with this coding.
    Compress(Coding),
}

/// The configured compression (`compression`).
#[derive(Clone, Debug)]
pub struct Policy {
    /// In preference order.
    pub algorithms: Vec<Coding>,
    /// Smaller declared lengths are left as they are.
    pub min_bytes: u64,
    /// Bodies compressed at once at most (each holds an encoder's state):
    /// past it, responses go as they are.
    pub max_streams: usize,
    pub types: Vec<TypePattern>,
    pub levels: encoder::Levels,
}

impl Policy {
    /// The coding a client that sent `accept` (its `Accept-Encoding`
    /// values) would get: [`negotiate`] over this policy's algorithms.
    pub fn negotiate<'a>(&self, accept: impl Iterator<Item = &'a [u8]>) -> Option<Coding> {
        negotiate(&self.algorithms, accept)
    }

    /// The decision for a response described by `facts` to a client that
    /// negotiated `coding` (see [`Policy::negotiate`]).
    pub fn decide(&self, facts: &ResponseFacts<'_>, coding: Option<Coding>) -> Decision {
        match (self.candidate(facts), coding) {
            (false, _) => Decision::Leave,
            (true, Some(coding)) => Decision::Compress(coding),
            (true, None) => Decision::LeaveVaried,
        }
    }

    /// Whether a response could be compressed, whoever asked: it has a
    /// body, not already encoded, of a listed type, large enough or of
    /// unknown length, and nothing forbids it.
    fn candidate(&self, f: &ResponseFacts<'_>) -> bool {
        let typed = f
            .content_type
            .is_some_and(|t| self.types.iter().any(|p| p.matches(t)));
        sized_for_it(f.head_request, f.status, f.content_length, self.min_bytes)
            && !f.ranged
            && !f.encoded
            && !f.no_transform
            && typed
    }
}

/// The part of the rule no field is read for: a response that has a body
/// (not to HEAD; not 1xx, 204 or 304), whole (not 206), and of unknown
/// length or at least `min_bytes` (and not empty).
fn sized_for_it(head_request: bool, status: u16, length: Option<u64>, min_bytes: u64) -> bool {
    !head_request
        && !matches!(status, 100..=199 | 204 | 206 | 304)
        && length.is_none_or(|n| n > 0 && n >= min_bytes)
}

impl<'a> ResponseFacts<'a> {
    /// The facts of a response head: its `status`, whether it is
    /// `bodiless` by rule (to HEAD; 1xx, 204, 304), its declared `length`,
    /// and its fields by name through `values`. A response no policy
    /// whose smallest body is `smallest` bytes would compress (bodiless,
    /// partial, declared empty or shorter) has its fields left unread:
    /// nothing they say could change the decision.
    pub fn of<I: Iterator<Item = &'a [u8]>>(
        status: u16,
        bodiless: bool,
        length: Option<u64>,
        smallest: u64,
        values: impl Fn(&'static str) -> I,
    ) -> Self {
        let known = ResponseFacts {
            head_request: bodiless,
            status,
            content_length: length,
            ..ResponseFacts::default()
        };
        if !sized_for_it(bodiless, status, length, smallest) {
            return known;
        }
        ResponseFacts {
            content_type: values("content-type").next(),
            encoded: is_encoded(values("content-encoding")),
            no_transform: says_no_transform(values("cache-control")),
            ranged: values("content-range").next().is_some(),
            ..known
        }
    }
}

impl Decision {
    pub fn coding(self) -> Option<Coding> {
        match self {
            Decision::Compress(coding) => Some(coding),
            _ => None,
        }
    }

    /// Whether a shard's field `name` goes from the head: a compressed
    /// body has no length, no ranges, its `ETag` comes back weak and its
    /// coding is ours ([`Decision::fields`]; the shard's could only say
    /// `identity`).
    pub fn drops(self, name: &[u8]) -> bool {
        let is = |field: &str| name.eq_ignore_ascii_case(field.as_bytes());
        self.coding().is_some()
            && (is("content-length") || is("accept-ranges") || is("etag") || is("content-encoding"))
    }

    /// The fields to add to a head whose shard's fields are `fields`:
    /// `Content-Encoding`, the `ETag` made weak, and `Vary:
    /// Accept-Encoding` unless the shard's `Vary` covers it.
    pub fn fields(self, fields: &[(&[u8], &[u8])]) -> Vec<(&'static str, Vec<u8>)> {
        let mut out = Vec::new();
        if self == Decision::Leave {
            return out;
        }
        if let Some(coding) = self.coding() {
            out.push(("Content-Encoding", coding.token().as_bytes().to_vec()));
            let etags = fields
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case(b"etag"));
            for (_, value) in etags {
                out.push(("ETag", weak_etag(value).unwrap_or_else(|| value.to_vec())));
            }
        }
        let vary = (fields.iter())
            .filter(|(n, _)| n.eq_ignore_ascii_case(b"vary"))
            .map(|(_, v)| *v);
        if !varies_by_encoding(vary) {
            out.push(("Vary", b"Accept-Encoding".to_vec()));
        }
        out
    }
}

/// Whether `Cache-Control` values say `no-transform`.
pub fn says_no_transform<'a>(values: impl Iterator<Item = &'a [u8]>) -> bool {
    values
        .flat_map(|v| v.split(|&b| b == b','))
        .any(|d| d.trim_ascii().eq_ignore_ascii_case(b"no-transform"))
}

/// Whether `Content-Encoding` values name a coding other than `identity`.
pub fn is_encoded<'a>(values: impl Iterator<Item = &'a [u8]>) -> bool {
    values
        .flat_map(|v| v.split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .any(|c| !c.is_empty() && !c.eq_ignore_ascii_case(b"identity"))
}

/// A strong `ETag` made weak (`"x"` → `W/"x"`): the compressed bytes are
/// not the shard's bytes. `None` for one that is weak already.
pub fn weak_etag(value: &[u8]) -> Option<Vec<u8>> {
    let value = value.trim_ascii();
    (!value.starts_with(b"W/")).then(|| [b"W/".as_slice(), value].concat())
}

/// Whether `Vary` values already cover `Accept-Encoding` (or `*`).
pub fn varies_by_encoding<'a>(values: impl Iterator<Item = &'a [u8]>) -> bool {
    values.flat_map(|v| v.split(|&b| b == b',')).any(|name| {
        let name = name.trim_ascii();
        name == b"*" || name.eq_ignore_ascii_case(b"accept-encoding")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pick(algorithms: &[Coding], accept: &[&str]) -> Option<Coding> {
        negotiate(algorithms, accept.iter().map(|v| v.as_bytes()))
    }

    const ALL: [Coding; 3] = [Coding::Zstd, Coding::Br, Coding::Gzip];

    #[test]
    fn the_clients_weights_first_then_the_configured_order() {
        use Coding::*;
        assert_eq!(pick(&ALL, &["gzip, deflate, br, zstd"]), Some(Zstd));
        assert_eq!(pick(&ALL, &["gzip, deflate, br"]), Some(Br));
        assert_eq!(pick(&[Gzip, Br], &["br", "gzip"]), Some(Gzip));
        assert_eq!(pick(&ALL, &["br;q=0.5, gzip;q=0.8"]), Some(Gzip));
        assert_eq!(pick(&ALL, &["zstd;q=0, br;q=0.001"]), Some(Br));
        assert_eq!(pick(&ALL, &["GZIP; Q=1.000"]), Some(Gzip));
        assert_eq!(pick(&ALL, &["x-gzip"]), Some(Gzip));
        assert_eq!(pick(&ALL, &["*"]), Some(Zstd));
        assert_eq!(pick(&ALL, &["*;q=0.5, zstd;q=0.4"]), Some(Br));
        assert_eq!(pick(&ALL, &["*, zstd;q=0, br;q=0"]), Some(Gzip));
        assert_eq!(pick(&ALL, &["*;q=0"]), None);
        assert_eq!(pick(&ALL, &["identity"]), None);
        assert_eq!(pick(&ALL, &[""]), None);
        assert_eq!(pick(&ALL, &[]), None, "no field: identity");
        assert_eq!(pick(&[Gzip], &["br, zstd"]), None, "not configured");
        // Weights that are not qvalues: the element is ignored.
        assert_eq!(pick(&ALL, &["zstd;q=2, br;q=0.5555, gzip;q=x"]), None);
        assert_eq!(pick(&ALL, &["zstd;q=1.5, gzip"]), Some(Gzip));
    }

    #[test]
    fn types_match_by_their_essence() {
        let html = TypePattern::parse("text/html").expect("type");
        let text = TypePattern::parse("Text/*").expect("type");
        assert!(html.matches(b"text/html; charset=utf-8"));
        assert!(html.matches(b" TEXT/HTML"));
        assert!(!html.matches(b"text/htmlx"));
        assert!(text.matches(b"text/css"));
        assert!(!text.matches(b"textual/css"));
        assert!(!text.matches(b"text"));
        for bad in ["text", "*/*", "text/", "te xt/html", "/html"] {
            assert!(TypePattern::parse(bad).is_err(), "{bad}");
        }
    }

    fn policy() -> Policy {
        Policy {
            algorithms: vec![Coding::Gzip],
            min_bytes: 1024,
            max_streams: 16,
            types: vec![TypePattern::parse("text/*").expect("type")],
            levels: encoder::Levels::default(),
        }
    }

    #[test]
    fn fields_that_cannot_change_the_decision_are_not_read() {
        let p = policy();
        let fields: [(&str, &[u8]); 2] = [
            ("content-type", b"text/html"),
            ("cache-control", b"max-age=1"),
        ];
        for (status, bodiless, length) in [
            (200, false, None),
            (200, false, Some(1024)),
            (200, false, Some(1023)),
            (200, false, Some(0)),
            (200, true, Some(4096)),
            (204, false, None),
            (206, false, Some(4096)),
            (304, false, None),
            (103, false, None),
        ] {
            let reads = std::cell::Cell::new(0);
            let values = |name: &'static str| {
                reads.set(reads.get() + 1);
                let found = fields.iter().filter(move |(n, _)| *n == name);
                found.map(|(_, v)| *v)
            };
            let quick = ResponseFacts::of(status, bodiless, length, p.min_bytes, values);
            let read = reads.get() > 0;
            let whole = ResponseFacts::of(status, bodiless, length, 0, values);
            let case = (status, bodiless, length);
            for coding in [None, Some(Coding::Gzip)] {
                assert_eq!(
                    p.decide(&quick, coding),
                    p.decide(&whole, coding),
                    "{case:?}"
                );
            }
            let candidate = status == 200 && !bodiless && length.is_none_or(|n| n >= 1024);
            assert_eq!(read, candidate, "{case:?}");
        }
    }

    #[test]
    fn only_bodies_that_may_be_compressed_are() {
        let p = policy();
        let base = ResponseFacts {
            status: 200,
            content_type: Some(b"text/html"),
            ..Default::default()
        };
        let decide = |f: ResponseFacts<'_>| p.decide(&f, Some(Coding::Gzip));
        assert_eq!(
            decide(base),
            Decision::Compress(Coding::Gzip),
            "unknown length"
        );
        let sized = |n| ResponseFacts {
            content_length: Some(n),
            ..base
        };
        assert_eq!(decide(sized(1024)), Decision::Compress(Coding::Gzip));
        assert_eq!(decide(sized(1023)), Decision::Leave);
        for refused in [
            ResponseFacts {
                head_request: true,
                ..base
            },
            ResponseFacts {
                status: 204,
                ..base
            },
            ResponseFacts {
                status: 304,
                ..base
            },
            ResponseFacts {
                status: 206,
                ..base
            },
            ResponseFacts {
                ranged: true,
                ..base
            },
            ResponseFacts {
                encoded: true,
                ..base
            },
            ResponseFacts {
                no_transform: true,
                ..base
            },
            ResponseFacts {
                content_type: Some(b"image/png"),
                ..base
            },
            ResponseFacts {
                content_type: None,
                ..base
            },
        ] {
            assert_eq!(decide(refused), Decision::Leave, "{refused:?}");
        }
        let refused_client = p.decide(&base, p.negotiate([b"br".as_slice()].into_iter()));
        assert_eq!(refused_client, Decision::LeaveVaried);
        assert_eq!(decide(sized(0)), Decision::Leave, "nothing to compress");
        assert_eq!(
            decide(ResponseFacts {
                status: 404,
                ..base
            }),
            Decision::Compress(Coding::Gzip)
        );
    }

    #[test]
    fn head_fields_say_what_the_body_became() {
        assert!(says_no_transform(
            [b"public, No-Transform".as_slice()].into_iter()
        ));
        assert!(!says_no_transform([b"no-store".as_slice()].into_iter()));
        assert!(is_encoded([b"gzip".as_slice()].into_iter()));
        assert!(!is_encoded(
            [b"identity".as_slice(), b"".as_slice()].into_iter()
        ));
        assert_eq!(
            weak_etag(b"\"v1\"").as_deref(),
            Some(b"W/\"v1\"".as_slice())
        );
        assert_eq!(weak_etag(b"W/\"v1\""), None);
        assert!(varies_by_encoding(
            [b"Origin, accept-encoding".as_slice()].into_iter()
        ));
        assert!(varies_by_encoding([b"*".as_slice()].into_iter()));
        assert!(!varies_by_encoding([b"Origin".as_slice()].into_iter()));
    }

    #[test]
    fn a_compressed_head_loses_its_length_and_says_its_coding() {
        let shard: [(&[u8], &[u8]); 4] = [
            (b"Content-Length", b"5000"),
            (b"ETag", b"\"v1\""),
            (b"Vary", b"Origin"),
            (b"Accept-Ranges", b"bytes"),
        ];
        let compress = Decision::Compress(Coding::Br);
        let kept: Vec<&[u8]> = (shard.iter())
            .filter(|(n, _)| !compress.drops(n))
            .map(|(n, _)| *n)
            .collect();
        assert_eq!(kept, [b"Vary".as_slice()]);
        assert!(
            compress.drops(b"Content-Encoding"),
            "the shard's `identity`"
        );
        let added = compress.fields(&shard);
        let text: Vec<(&str, &str)> = (added.iter())
            .map(|(n, v)| (*n, std::str::from_utf8(v).unwrap_or("?")))
            .collect();
        assert_eq!(
            text,
            [
                ("Content-Encoding", "br"),
                ("ETag", "W/\"v1\""),
                ("Vary", "Accept-Encoding")
            ]
        );
        let varied = Decision::LeaveVaried;
        assert!(!varied.drops(b"content-length"));
        assert_eq!(
            varied.fields(&shard[..1]),
            [("Vary", b"Accept-Encoding".to_vec())]
        );
        let covered: [(&[u8], &[u8]); 1] = [(b"vary", b"accept-encoding")];
        assert!(varied.fields(&covered).is_empty());
        assert!(Decision::Leave.fields(&shard).is_empty());
    }
}
