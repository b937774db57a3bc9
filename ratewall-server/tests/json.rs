//! `POST /json` of the real binary as envoyproxy/ratelimit's `/json`
//! (`src/server/server_impl.go`, `NewJsonHandler`) behaves: the request
//! read with protojson (JSON names or proto names, unknown fields refused),
//! 200 when within the limits, 429 when over, 400 when the request does not
//! read or is refused, and the answer in the proto3 JSON mapping.

mod support;

use serde_json::{json, Value};
use support::{http, ConfigDir, HttpGot, Server};

const CONFIG: &str = r#"
domain: web
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: tenant
    rate_limit:
      name: per_tenant
      unit: hour
      requests_per_unit: 5
  - key: health
    rate_limit:
      unlimited: true
"#;

fn serve() -> (ConfigDir, Server) {
    let dir = ConfigDir::new(&[("config.yaml", CONFIG)]);
    let server = Server::start(&dir.path, &[]);
    (dir, server)
}

async fn post(server: &Server, body: &str) -> HttpGot {
    http(server.http, "POST", "/json", body).await
}

/// The answer's JSON, after checking it is one.
fn answer(got: &HttpGot) -> Value {
    assert_eq!(
        got.content_type.as_deref(),
        Some("application/json"),
        "{got:?}"
    );
    serde_json::from_str(&got.body).unwrap_or_else(|e| panic!("{e}: {}", got.body))
}

/// Every object key in `v`, recursively.
fn keys(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                out.push(k.clone());
                keys(v, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|i| keys(i, out)),
        _ => {}
    }
}

/// A `durationUntilReset` in seconds: `"59s"`, `"59.5s"`.
fn seconds(text: &Value) -> f64 {
    let text = text.as_str().unwrap_or_else(|| panic!("{text}"));
    text.strip_suffix('s')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a JSON-mapping duration: {text}"))
}

fn user(value: &str) -> String {
    json!({"domain": "web", "descriptors": [{"entries": [{"key": "user", "value": value}]}]})
        .to_string()
}

#[tokio::test]
async fn within_is_200_over_is_429_in_the_json_mapping() {
    let (_dir, server) = serve();
    let got = post(&server, &user("ada")).await;
    assert_eq!(got.status, 200, "{got:?}");
    let v = answer(&got);
    assert_eq!(v["overallCode"], "OK", "{v}");
    let s = &v["statuses"][0];
    assert_eq!(s["code"], "OK");
    assert_eq!(
        s["currentLimit"],
        json!({"requestsPerUnit": 2, "unit": "MINUTE"})
    );
    assert_eq!(s["limitRemaining"], 1);
    let reset = seconds(&s["durationUntilReset"]);
    assert!(reset > 0.0 && reset <= 60.0, "{reset}");
    // Only the JSON names: no proto (snake_case) name in the answer.
    let mut names = Vec::new();
    keys(&v, &mut names);
    assert!(names.iter().all(|k| !k.contains('_')), "{names:?}");

    // The last one within: `limitRemaining` 0 is left out, as protojson
    // leaves out every field at its default.
    let v = answer(&post(&server, &user("ada")).await);
    assert_eq!(v["statuses"][0]["code"], "OK");
    assert!(v["statuses"][0].get("limitRemaining").is_none(), "{v}");

    let got = post(&server, &user("ada")).await;
    assert_eq!(got.status, 429, "{got:?}");
    let v = answer(&got);
    assert_eq!(v["overallCode"], "OVER_LIMIT");
    assert_eq!(v["statuses"][0]["code"], "OVER_LIMIT");
    assert!(
        seconds(&v["statuses"][0]["durationUntilReset"]) > 0.0,
        "{v}"
    );

    // Another user is within: 200 again.
    assert_eq!(post(&server, &user("bob")).await.status, 200);
}

#[tokio::test]
async fn every_descriptor_gets_a_status_in_order_and_one_over_makes_429() {
    let (_dir, server) = serve();
    let body = json!({"domain": "web", "descriptors": [
        {"entries": [{"key": "tenant", "value": "t1"}]},
        {"entries": [{"key": "nothing", "value": "x"}]},
        {"entries": [{"key": "health", "value": "/ping"}]},
        {"entries": [{"key": "user", "value": "cy"}]},
    ]})
    .to_string();
    let v = answer(&post(&server, &body).await);
    let statuses = v["statuses"].as_array().unwrap();
    assert_eq!(statuses.len(), 4, "{v}");
    assert_eq!(
        statuses[0]["currentLimit"],
        json!({"name": "per_tenant", "requestsPerUnit": 5, "unit": "HOUR"})
    );
    assert_eq!(statuses[0]["limitRemaining"], 4);
    // No limit: the code alone.
    assert_eq!(statuses[1], json!({"code": "OK"}));
    // Unlimited: the largest remaining, no limit, no reset.
    assert_eq!(
        statuses[2],
        json!({"code": "OK", "limitRemaining": u64::from(u32::MAX)})
    );
    assert_eq!(statuses[3]["limitRemaining"], 1);
    post(&server, &body).await;
    let got = post(&server, &body).await;
    assert_eq!(got.status, 429);
    let v = answer(&got);
    let codes: Vec<&Value> = v["statuses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["code"])
        .collect();
    assert_eq!(codes, ["OK", "OK", "OK", "OVER_LIMIT"], "{v}");
    // A domain nothing configures: 200, the code alone.
    let unknown = body.replace("\"web\"", "\"elsewhere\"");
    let got = post(&server, &unknown).await;
    assert_eq!(got.status, 200, "{got:?}");
    assert_eq!(
        answer(&got),
        json!({"overallCode": "OK", "statuses": [{"code": "OK"}, {"code": "OK"}, {"code": "OK"}, {"code": "OK"}]})
    );
}

#[tokio::test]
async fn requests_in_proto_field_names_and_protojson_forms_are_read() {
    let (_dir, server) = serve();
    let remaining = |got: &HttpGot| answer(got)["statuses"][0]["limitRemaining"].clone();
    let tenant = |t: &str, extra: Value| -> String {
        let mut v =
            json!({"domain": "web", "descriptors": [{"entries": [{"key": "tenant", "value": t}]}]});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v.to_string()
    };
    // `hits_addend` (the proto name) and `hitsAddend` (the JSON name), as
    // a number or as a string: each is the cost.
    for (t, extra) in [
        ("a", json!({"hits_addend": 2})),
        ("b", json!({"hitsAddend": 2})),
        ("c", json!({"hitsAddend": "2"})),
    ] {
        let got = post(&server, &tenant(t, extra.clone())).await;
        assert_eq!(got.status, 200, "{extra}: {got:?}");
        assert_eq!(remaining(&got), 3, "{extra}");
    }
    // `null` is the field's default (cost 1).
    let got = post(&server, &tenant("d", json!({"hitsAddend": null}))).await;
    assert_eq!((got.status, remaining(&got)), (200, json!(4)), "{got:?}");
    // A descriptor's own limit, in either spelling, the unit by name or
    // by number (2 is MINUTE).
    for (t, limit) in [
        ("e", json!({"requests_per_unit": 7, "unit": "MINUTE"})),
        ("f", json!({"requestsPerUnit": 7, "unit": 2})),
    ] {
        let body = json!({"domain": "web", "descriptors": [
            {"entries": [{"key": "tenant", "value": t}], "limit": limit}
        ]})
        .to_string();
        let v = answer(&post(&server, &body).await);
        assert_eq!(
            v["statuses"][0]["currentLimit"],
            json!({"requestsPerUnit": 7, "unit": "MINUTE"}),
            "{limit}"
        );
        assert_eq!(v["statuses"][0]["limitRemaining"], 6);
    }
}

#[tokio::test]
async fn requests_that_do_not_read_or_are_refused_are_400() {
    let (_dir, server) = serve();
    let cases = [
        ("not JSON", "{".to_owned()),
        ("empty body", String::new()),
        (
            "unknown top-level field",
            json!({"domain": "web", "descriptors": [{"entries": [{"key": "user", "value": "x"}]}], "extra": 1}).to_string(),
        ),
        (
            "unknown entry field",
            json!({"domain": "web", "descriptors": [{"entries": [{"key": "user", "value": "x", "weight": 3}]}]}).to_string(),
        ),
        (
            "unknown unit name",
            json!({"domain": "web", "descriptors": [{"entries": [{"key": "user", "value": "x"}], "limit": {"requestsPerUnit": 1, "unit": "FORTNIGHT"}}]}).to_string(),
        ),
        (
            "a list where an object goes",
            json!({"domain": "web", "descriptors": 5}).to_string(),
        ),
        (
            "hitsAddend past uint32",
            json!({"domain": "web", "descriptors": [{"entries": [{"key": "user", "value": "x"}]}], "hitsAddend": 4_294_967_296_u64}).to_string(),
        ),
        (
            "one field in both spellings (protojson: duplicate field)",
            r#"{"domain":"web","descriptors":[{"entries":[{"key":"user","value":"x"}]}],"hitsAddend":1,"hits_addend":2}"#.to_owned(),
        ),
        (
            "a string where a list goes",
            json!({"domain": "web", "descriptors": [{"entries": "user=x"}]}).to_string(),
        ),
        (
            "no domain (the service refuses it)",
            json!({"descriptors": [{"entries": [{"key": "user", "value": "x"}]}]}).to_string(),
        ),
        (
            "no descriptors (the service refuses it)",
            json!({"domain": "web"}).to_string(),
        ),
    ];
    let mut wrong = Vec::new();
    for (name, body) in &cases {
        let got = post(&server, body).await;
        if got.status != 400 {
            wrong.push(format!("{name}: {} {}", got.status, got.body));
        }
    }
    assert!(wrong.is_empty(), "not 400:\n{}", wrong.join("\n"));
    // None of them was counted: `x` still has its 2.
    let v = answer(&post(&server, &user("x")).await);
    assert_eq!(v["statuses"][0]["limitRemaining"], 1, "{v}");
}

#[tokio::test]
async fn a_one_megabyte_body_is_answered_and_the_server_keeps_serving() {
    let (_dir, server) = serve();
    const MB: usize = 1 << 20;
    // One value of 1 MB.
    let big = "v".repeat(MB);
    let got = post(&server, &user(&big)).await;
    assert_eq!(got.status, 200, "{}", &got.body[..got.body.len().min(200)]);
    assert_eq!(answer(&got)["statuses"][0]["limitRemaining"], 1);
    // About 1 MB of descriptors (some 20,000): each answered.
    let n = MB / 50;
    let descriptors: Vec<Value> = (0..n)
        .map(|i| json!({"entries": [{"key": "user", "value": format!("u{i}")}]}))
        .collect();
    let body = json!({"domain": "web", "descriptors": descriptors}).to_string();
    assert!(body.len() >= MB - MB / 10, "{}", body.len());
    let got = post(&server, &body).await;
    assert_eq!(got.status, 200);
    let v = answer(&got);
    let statuses = v["statuses"].as_array().unwrap();
    assert_eq!(statuses.len(), n);
    assert!(statuses.iter().all(|s| s["limitRemaining"] == 1));
    // 1 MB that is not JSON.
    let got = post(&server, &"{".repeat(MB)).await;
    assert_eq!(got.status, 400);
    // Still serving.
    let health = http(server.http, "GET", "/healthcheck", "").await;
    assert_eq!(health.status, 200);
    assert_eq!(post(&server, &user("after")).await.status, 200);
}

/// protojson reads an integer field written as any JSON number with an
/// integral value (`2.0`, `2e0`), as envoyproxy/ratelimit's `/json` does.
#[tokio::test]
async fn integral_numbers_in_any_json_form_are_integers() {
    let (_dir, server) = serve();
    for (t, hits) in [("g", "2.0"), ("h", "2e0"), ("i", "0.2e1")] {
        let body = format!(
            r#"{{"domain":"web","descriptors":[{{"entries":[{{"key":"tenant","value":"{t}"}}]}}],"hitsAddend":{hits}}}"#
        );
        let got = post(&server, &body).await;
        assert_eq!(got.status, 200, "hitsAddend {hits}: {got:?}");
        assert_eq!(answer(&got)["statuses"][0]["limitRemaining"], 3, "{hits}");
    }
    // Not integral: refused.
    let body = r#"{"domain":"web","descriptors":[{"entries":[{"key":"tenant","value":"j"}]}],"hitsAddend":2.5}"#;
    assert_eq!(post(&server, body).await.status, 400);
}
