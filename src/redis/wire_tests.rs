use super::*;

#[test]
fn replies_become_decisions_and_bad_replies_errors() {
    let ok = Value::Array(vec![
        Value::Int(1),
        Value::Int(10),
        Value::Int(7),
        Value::Int(0),
        Value::Int(300),
    ]);
    assert_eq!(
        parse_decision(&ok).unwrap(),
        Decision::allow(10, 7, 300_000)
    );
    let deny = Value::Array(vec![
        Value::Int(0),
        Value::Int(10),
        Value::Int(0),
        Value::Int(5),
        Value::Int(9),
    ]);
    assert_eq!(
        parse_decision(&deny).unwrap(),
        Decision::deny(10, 0, 5_000, 9_000)
    );
    for bad in [
        Value::Int(1),
        Value::Array(vec![Value::Int(1)]),
        Value::Array(vec![Value::Int(-1); 5]),
        Value::Nil,
    ] {
        assert!(matches!(parse_decision(&bad), Err(Fault::Store(_))));
    }
}

#[test]
fn replies_become_marked_decisions_and_bad_replies_errors() {
    let reply = |v: [i64; 6]| Value::Array(v.iter().map(|&x| Value::Int(x)).collect());
    let d = parse_elastic(&reply([1, 10, 0, 0, 300, 1])).unwrap();
    assert!(d.is_allowed() && d.is_above_limit());
    assert_eq!(
        (d.limit(), d.remaining(), d.reset_after_ns),
        (10, 0, 300_000)
    );
    let d = parse_elastic(&reply([0, 10, 0, 5, 9, 0])).unwrap();
    assert!(!d.is_allowed() && !d.is_above_limit());
    for bad in [
        reply([1, 10, 0, 0, 300, 2]),
        reply([1, 10, -1, 0, 300, 0]),
        Value::Array(vec![Value::Int(1); 5]),
        Value::Nil,
    ] {
        assert!(matches!(parse_elastic(&bad), Err(Fault::Store(_))));
    }
}

#[test]
fn multi_replies_become_decisions_and_bad_replies_errors() {
    let reply = |v: &[i64]| Value::Array(v.iter().map(|&x| Value::Int(x)).collect());
    let (all, d) = parse_multi(&reply(&[1, 1, 10, 7, 0, 300, 1, 5, 4, 0, 200]), 2).unwrap();
    assert!(all);
    assert_eq!(
        d,
        [
            Decision::allow(10, 7, 300_000),
            Decision::allow(5, 4, 200_000)
        ]
    );
    let (all, d) = parse_multi(&reply(&[0, 0, 10, 0, 5, 9]), 1).unwrap();
    assert!(!all);
    assert_eq!(d, [Decision::deny(10, 0, 5_000, 9_000)]);
    for bad in [
        reply(&[1, 1, 10, 7, 0, 300]),
        reply(&[1, 1, 10, -7, 0, 300, 1, 5, 4, 0, 200]),
        Value::Nil,
    ] {
        assert!(matches!(parse_multi(&bad, 2), Err(Fault::Store(_))));
    }
}
