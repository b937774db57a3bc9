//! Path prefixes as a normalizing router sees them: a rule's
//! [`on_path_prefix`](super::Rule::on_path_prefix) is matched against the
//! request's path after RFC 3986 normalization (section 6.2.2):
//! percent-encoded unreserved characters decoded (`/%6Cogin` is `/login`),
//! the other escapes' hex digits in capitals, empty segments dropped
//! (`//login`), and `.` and `..` segments resolved (`/a/../login`), never
//! above the root. A router that routes any of these spellings to a route
//! under the prefix (or a layer that normalizes the path before the
//! router) thus cannot reach it around the rule. Matching is by whole
//! segments, and case-sensitive unless the rule says otherwise, as axum's
//! router is.
//!
//! A path that is already normal (no `%`, no empty, `.` or `..` segment:
//! nearly every real request) is matched as it is, with no allocation;
//! another is normalized into a new string, once per rule that looks.

/// Whether `path`, normalized, is under `prefix` (itself normal, from
/// [`normalize`]): equal to it, or continuing it with a new segment (a
/// prefix that ends with `/` matches anything after it). With
/// `ignore_case`, ASCII letters match in either case.
pub(super) fn under(prefix: &str, path: &str, ignore_case: bool) -> bool {
    if is_normal(path) {
        return starts(prefix, path, ignore_case);
    }
    starts(prefix, &normalize(path), ignore_case)
}

/// Whether normal `path` starts with `prefix` at a segment boundary.
fn starts(prefix: &str, path: &str, ignore_case: bool) -> bool {
    let (p, s) = (prefix.as_bytes(), path.as_bytes());
    let Some(head) = s.get(..p.len()) else {
        return false;
    };
    let same = match ignore_case {
        true => head.eq_ignore_ascii_case(p),
        false => head == p,
    };
    same && (p.ends_with(b"/") || s.len() == p.len() || s[p.len()] == b'/')
}

/// Whether `path` is its own normal form: it starts with `/` and has no
/// `%`, no empty segment but a trailing one, and no `.` or `..` segment.
pub(super) fn is_normal(path: &str) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    if rest.contains('%') {
        return false;
    }
    let last = rest.bytes().filter(|&c| c == b'/').count();
    rest.split('/').enumerate().all(|(i, seg)| match seg {
        // Only the last piece may be empty: a trailing `/` (kept).
        "" => i == last,
        "." | ".." => false,
        _ => true,
    })
}

/// The normal form of `path` (see the module docs). A path that does not
/// start with `/` (`*`, an authority form) is treated as if it did.
pub(super) fn normalize(path: &str) -> String {
    let decoded = decode_unreserved(path.as_bytes());
    let ends_open = decoded.ends_with(b"/")
        || decoded.ends_with(b"/.")
        || decoded.ends_with(b"/..")
        || decoded == b"."
        || decoded == b"..";
    let mut out = Vec::with_capacity(decoded.len() + 1);
    for seg in decoded.split(|&c| c == b'/') {
        match seg {
            b"" | b"." => {}
            // Up one: drop the last segment written (none above the root).
            b".." => out.truncate(out.iter().rposition(|&c| c == b'/').unwrap_or(0)),
            s => {
                out.push(b'/');
                out.extend_from_slice(s);
            }
        }
    }
    if out.is_empty() || ends_open {
        out.push(b'/');
    }
    // Still UTF-8 (never fails): the path was, splits at `/` keep its
    // characters whole, and decoding yields ASCII only.
    String::from_utf8(out).unwrap_or_default()
}

/// `path` with escapes of unreserved characters (`A-Z a-z 0-9 - . _ ~`)
/// decoded and the others' hex digits in capitals; a `%` not followed by
/// two hex digits is left as it is.
fn decode_unreserved(path: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        let c = path[i];
        let hex = path.get(i + 1..i + 3).and_then(|h| {
            let d = |x: u8| (x as char).to_digit(16);
            Some(d(h[0])? * 16 + d(h[1])?)
        });
        match (c, hex) {
            (b'%', Some(v)) => {
                // A value from two hex digits fits in a byte.
                let v = v as u8;
                if v.is_ascii_alphanumeric() || matches!(v, b'-' | b'.' | b'_' | b'~') {
                    out.push(v);
                } else {
                    out.push(b'%');
                    out.extend_from_slice(path[i + 1..i + 3].to_ascii_uppercase().as_slice());
                }
                i += 3;
            }
            _ => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn spellings_of_one_path_normalize_to_it() {
        for (raw, want) in [
            ("/login", "/login"),
            ("//login", "/login"),
            ("/./login", "/login"),
            ("/%6cogin", "/login"),
            ("/%6Cogin", "/login"),
            ("/login/../login", "/login"),
            ("/a/b/../../login/", "/login/"),
            ("/../../login", "/login"),
            ("/%2e%2e/login", "/login"),
            ("/login/.", "/login/"),
            ("/login/..", "/"),
            ("/login%2fotp", "/login%2Fotp"),
            ("/login%2Fotp", "/login%2Fotp"),
            ("/100%", "/100%"),
            ("/%zz/%4", "/%zz/%4"),
            ("/a%20b", "/a%20b"),
            ("/a%2fb", "/a%2Fb"),
            ("", "/"),
            ("*", "/*"),
            ("/", "/"),
            ("///", "/"),
        ] {
            assert_eq!(normalize(raw), want, "{raw}");
        }
    }

    #[test]
    fn prefixes_match_whole_segments_in_any_spelling() {
        for path in [
            "/login",
            "/login/otp",
            "//login",
            "/./login",
            "/%6cogin/otp",
            "/x/../login",
        ] {
            assert!(under("/login", path, false), "{path}");
        }
        for path in ["/loginx", "/log", "/", "/%6coginx", "/login%2Fx", "/LOGIN"] {
            assert!(!under("/login", path, false), "{path}");
        }
        for path in ["/LOGIN", "/Login/otp", "//LoGiN", "/%4cogin"] {
            assert!(under("/login", path, true), "{path}");
        }
        assert!(!under("/login", "/LOGINX", true));
        assert!(under("/api/", "/api/x", false) && !under("/api/", "/api", false));
    }

    proptest! {
        /// Normal paths are left alone (the fast path is right), and
        /// normalizing twice changes nothing.
        #[test]
        fn normal_forms_are_fixed_points(
            path in "(/(a|B|\\.|\\.\\.|%6[cC]|%2[fFeE]|%|~|)){0,8}"
        ) {
            let once = normalize(&path);
            prop_assert!(is_normal(&once) || once.contains('%'), "{once}");
            prop_assert_eq!(normalize(&once), once.clone());
            if is_normal(&path) {
                prop_assert_eq!(once, path);
            }
        }
    }
}
