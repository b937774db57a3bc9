//! Unit tests of `rule.rs`: names and matchers.

use super::*;
use http::Extensions;

#[test]
fn names_are_tokens_without_escapes() {
    for ok in ["default", "ip", "per-ip/v6:56", "a", "Login_1.x"] {
        assert!(valid_name(ok), "{ok}");
    }
    let long = "a".repeat(65);
    for bad in [
        "",
        "1ip",
        "-x",
        "a b",
        "a\"b",
        "a\\b",
        "a,b",
        "a;b",
        "é",
        long.as_str(),
        "*x",
    ] {
        assert!(!valid_name(bad), "{bad}");
    }
}

#[test]
fn path_prefixes_match_whole_segments() {
    let m = Matcher {
        methods: vec![Method::POST],
        path_prefix: Some("/login".into()),
        ignore_case: false,
        route: None,
    };
    let (h, e) = (HeaderMap::new(), Extensions::new());
    let check = |method: Method, path: &str| {
        let uri: Uri = path.parse().unwrap();
        m.matches(&RequestParts::sample(&method, &uri, &h, &e))
    };
    assert!(check(Method::POST, "/login"));
    assert!(check(Method::POST, "/login/otp"));
    assert!(check(Method::POST, "/login?x=1"));
    assert!(!check(Method::POST, "/loginx"));
    assert!(!check(Method::GET, "/login"));
    assert!(!check(Method::POST, "/"));
}

#[test]
fn path_prefixes_match_every_spelling_of_the_path() {
    let rule = |r: Rule| r.matcher;
    let base = || {
        Rule::per_ip(
            "login",
            crate::Policy::token_bucket(crate::Rate::per_second(1)),
        )
    };
    let exact = rule(base().on_path_prefix("/login"));
    let any_case = rule(base().on_path_prefix("//%6Cogin/").ignore_path_case());
    let (h, e) = (HeaderMap::new(), Extensions::new());
    let check = |m: &Matcher, path: &str| {
        let uri: Uri = path.parse().unwrap();
        m.matches(&RequestParts::sample(&Method::GET, &uri, &h, &e))
    };
    for path in [
        "/login",
        "//login",
        "/./login",
        "/%6cogin",
        "/login/../login",
        "/a/../login/otp",
    ] {
        assert!(check(&exact, path), "{path}");
    }
    for path in ["/LOGIN", "/loginx", "/login%2Fotp", "/logi"] {
        assert!(!check(&exact, path), "{path}");
    }
    // The prefix is normalized too (here `/login/`: what follows it).
    for path in ["/LOGIN/x", "//Login/otp", "/%4c%4fgin/a"] {
        assert!(check(&any_case, path), "{path}");
    }
    assert!(!check(&any_case, "/LOGINX/a"));
}
