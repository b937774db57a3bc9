//! The subset of RFC 9651 structured fields that the rate-limit headers use:
//! a List (§3.1) of Items with Parameters, parsed by the algorithm of
//! §4.2.1 over bytes, without allocating.
//!
//! Every bare item type of RFC 9651 except the Display String is
//! recognised (Integer, Decimal, String, Token, Byte Sequence, Boolean,
//! Date), and Inner Lists are parsed, so a valid field is never refused;
//! only Integers keep their value, because `q`, `w`, `r` and `t` are
//! Integers, and Strings and Tokens keep their raw bytes (`qu`'s unit is
//! one). As §4.2 requires, any syntax error fails the whole field
//! (the caller then ignores it). Work is bounded: the caller caps the
//! input's length, and a list of more than [`MAX_MEMBERS`] members, an
//! item with more than [`MAX_PARAMS`] parameters or an inner list of more
//! than [`MAX_MEMBERS`] items fails the field too (§4.2 allows such limits).

/// The most members a list may have (across every line of the field).
pub(super) const MAX_MEMBERS: usize = 16;
/// The most distinct parameters an item may have.
pub(super) const MAX_PARAMS: usize = 8;
/// The longest parameter key accepted.
const MAX_KEY: usize = 64;

/// A bare item's value, where it matters to the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Bare<'a> {
    /// An Integer: at most 15 digits, so it fits an `i64` exactly.
    Integer(i64),
    /// A String's bytes between the quotes (escapes left as sent) or a
    /// Token's bytes.
    Text(&'a [u8]),
    /// Any other bare item type (its value is not needed).
    Other,
}

/// One list member's parameters (an inner list's own parameters, or an
/// item's), borrowed from the input. A key given twice keeps its last
/// value (§4.2.3.2).
#[derive(Clone, Copy, Debug)]
pub(super) struct Member<'a> {
    /// Whether the member is an inner list rather than an item.
    pub(super) inner_list: bool,
    params: [(&'a [u8], Bare<'a>); MAX_PARAMS],
    len: usize,
}

impl<'a> Member<'a> {
    fn new(inner_list: bool) -> Member<'a> {
        Member {
            inner_list,
            params: [(&[], Bare::Other); MAX_PARAMS],
            len: 0,
        }
    }

    /// The value of parameter `key`, if the member has it.
    pub(super) fn param(&self, key: &str) -> Option<Bare<'a>> {
        self.params[..self.len]
            .iter()
            .find(|(k, _)| *k == key.as_bytes())
            .map(|&(_, v)| v)
    }

    /// The value of parameter `key` if it is a non-negative Integer.
    pub(super) fn uint(&self, key: &str) -> Option<u64> {
        match self.param(key)? {
            Bare::Integer(n) => u64::try_from(n).ok(),
            Bare::Text(_) | Bare::Other => None,
        }
    }

    fn set(&mut self, key: &'a [u8], value: Bare<'a>) -> Result<(), Fail> {
        if let Some(slot) = self.params[..self.len].iter_mut().find(|(k, _)| *k == key) {
            slot.1 = value;
            return Ok(());
        }
        let slot = self.params.get_mut(self.len).ok_or(Fail)?;
        *slot = (key, value);
        self.len += 1;
        Ok(())
    }
}

/// The field does not parse (or is over a limit): ignore all of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Fail;

/// Parses one field line as a List and calls `each` for every member, in
/// order. `seen` counts members across the lines of one field (the caller
/// passes the same counter for every line), so the cap covers the
/// combined field. On `Err`, members already passed to `each` belong to a
/// field that failed: the caller must drop what it learned from them.
pub(super) fn parse_list<'a>(
    input: &'a [u8],
    seen: &mut usize,
    mut each: impl FnMut(&Member<'a>),
) -> Result<(), Fail> {
    let mut p = Parser { input, pos: 0 };
    p.skip_sp();
    if p.at_end() {
        return Ok(());
    }
    loop {
        *seen += 1;
        if *seen > MAX_MEMBERS {
            return Err(Fail);
        }
        let member = p.member()?;
        each(&member);
        p.skip_ows();
        if p.at_end() {
            return Ok(());
        }
        p.expect(b',')?;
        p.skip_ows();
        if p.at_end() {
            // A trailing comma (§4.2.1).
            return Err(Fail);
        }
    }
}

struct Parser<'a> {
    input: &'a [u8],
    pos: usize,
}

impl<'a> Parser<'a> {
    fn at_end(&self) -> bool {
        self.pos >= self.input.len()
    }

    fn peek(&self) -> Option<u8> {
        self.input.get(self.pos).copied()
    }

    fn bump(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.pos += 1;
        Some(c)
    }

    fn expect(&mut self, c: u8) -> Result<(), Fail> {
        if self.bump() == Some(c) {
            Ok(())
        } else {
            Err(Fail)
        }
    }

    fn skip_sp(&mut self) {
        while self.peek() == Some(b' ') {
            self.pos += 1;
        }
    }

    fn skip_ows(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.pos += 1;
        }
    }

    /// §4.2.1.1: an inner list or an item, then its parameters.
    fn member(&mut self) -> Result<Member<'a>, Fail> {
        let inner_list = self.peek() == Some(b'(');
        if inner_list {
            self.inner_list()?;
        } else {
            self.bare_item()?;
        }
        let mut member = Member::new(inner_list);
        self.parameters(|k, v| member.set(k, v))?;
        Ok(member)
    }

    /// §4.2.1.2: `(` items with their parameters, space-separated, `)`.
    /// Only the inner list's own parameters are kept (by `member`).
    fn inner_list(&mut self) -> Result<(), Fail> {
        self.expect(b'(')?;
        let mut items = 0;
        loop {
            self.skip_sp();
            if self.peek() == Some(b')') {
                self.pos += 1;
                return Ok(());
            }
            items += 1;
            if items > MAX_MEMBERS {
                return Err(Fail);
            }
            self.bare_item()?;
            // The item's own parameters: capped like any item's, then dropped.
            let mut item = Member::new(false);
            self.parameters(|k, v| item.set(k, v))?;
            if !matches!(self.peek(), Some(b' ' | b')')) {
                return Err(Fail);
            }
        }
    }

    /// §4.2.3.2: `;key[=value]`, repeated; a key without a value is `?1`.
    fn parameters(
        &mut self,
        mut put: impl FnMut(&'a [u8], Bare<'a>) -> Result<(), Fail>,
    ) -> Result<(), Fail> {
        while self.peek() == Some(b';') {
            self.pos += 1;
            self.skip_sp();
            let key = self.key()?;
            let value = if self.peek() == Some(b'=') {
                self.pos += 1;
                self.bare_item()?
            } else {
                Bare::Other
            };
            put(key, value)?;
        }
        Ok(())
    }

    /// §4.2.3.3: `( lcalpha / "*" ) *( lcalpha / DIGIT / "_" / "-" / "." / "*" )`.
    fn key(&mut self) -> Result<&'a [u8], Fail> {
        let start = self.pos;
        match self.bump() {
            Some(b'a'..=b'z' | b'*') => {}
            _ => return Err(Fail),
        }
        while let Some(b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*') = self.peek() {
            self.pos += 1;
        }
        if self.pos - start > MAX_KEY {
            return Err(Fail);
        }
        Ok(&self.input[start..self.pos])
    }

    /// §4.2.3.1: the first character picks the type.
    fn bare_item(&mut self) -> Result<Bare<'a>, Fail> {
        match self.peek().ok_or(Fail)? {
            b'-' | b'0'..=b'9' => self.number(),
            b'"' => self.string(),
            b':' => self.byte_sequence(),
            b'?' => self.boolean(),
            b'@' => {
                // §4.2.9: a Date is `@` and an Integer.
                self.pos += 1;
                match self.number()? {
                    Bare::Integer(_) => Ok(Bare::Other),
                    _ => Err(Fail),
                }
            }
            b'A'..=b'Z' | b'a'..=b'z' | b'*' => self.token(),
            // Display Strings (`%"..."`) and anything else.
            _ => Err(Fail),
        }
    }

    /// §4.2.4: an Integer of at most 15 digits, or a Decimal of at most 12
    /// integer digits and 1 to 3 fraction digits.
    fn number(&mut self) -> Result<Bare<'a>, Fail> {
        let negative = self.peek() == Some(b'-');
        if negative {
            self.pos += 1;
        }
        let mut value: i64 = 0;
        let mut digits = 0;
        while let Some(c @ b'0'..=b'9') = self.peek() {
            digits += 1;
            if digits > 15 {
                return Err(Fail);
            }
            // At most 15 digits: below 10^15, no overflow.
            value = value * 10 + i64::from(c - b'0');
            self.pos += 1;
        }
        if digits == 0 {
            return Err(Fail);
        }
        if self.peek() != Some(b'.') {
            return Ok(Bare::Integer(if negative { -value } else { value }));
        }
        if digits > 12 {
            return Err(Fail);
        }
        self.pos += 1;
        let mut fraction = 0;
        while let Some(b'0'..=b'9') = self.peek() {
            fraction += 1;
            if fraction > 3 {
                return Err(Fail);
            }
            self.pos += 1;
        }
        if fraction == 0 {
            return Err(Fail);
        }
        Ok(Bare::Other)
    }

    /// §4.2.5: printable ASCII between quotes; `\` escapes only `"` and `\`.
    fn string(&mut self) -> Result<Bare<'a>, Fail> {
        self.expect(b'"')?;
        let start = self.pos;
        loop {
            match self.bump().ok_or(Fail)? {
                b'"' => return Ok(Bare::Text(&self.input[start..self.pos - 1])),
                b'\\' => match self.bump() {
                    Some(b'"' | b'\\') => {}
                    _ => return Err(Fail),
                },
                0x20..=0x7e => {}
                _ => return Err(Fail),
            }
        }
    }

    /// §4.2.6: `( ALPHA / "*" ) *( tchar / ":" / "/" )`.
    fn token(&mut self) -> Result<Bare<'a>, Fail> {
        let start = self.pos;
        self.pos += 1;
        while let Some(c) = self.peek() {
            let tchar = c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&c);
            if !tchar {
                break;
            }
            self.pos += 1;
        }
        Ok(Bare::Text(&self.input[start..self.pos]))
    }

    /// §4.2.7: base64 characters between colons.
    fn byte_sequence(&mut self) -> Result<Bare<'a>, Fail> {
        self.expect(b':')?;
        loop {
            match self.bump().ok_or(Fail)? {
                b':' => return Ok(Bare::Other),
                c if c.is_ascii_alphanumeric() || b"+/=".contains(&c) => {}
                _ => return Err(Fail),
            }
        }
    }

    /// §4.2.8: `?0` or `?1`.
    fn boolean(&mut self) -> Result<Bare<'a>, Fail> {
        self.expect(b'?')?;
        match self.bump() {
            Some(b'0' | b'1') => Ok(Bare::Other),
            _ => Err(Fail),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A member as the tests see it: `(inner_list, [(key, value)])`.
    type Seen<'a> = (bool, Vec<(String, Bare<'a>)>);

    /// The members, or `Err`.
    fn parse(s: &str) -> Result<Vec<Seen<'_>>, Fail> {
        let mut out = Vec::new();
        let mut seen = 0;
        parse_list(s.as_bytes(), &mut seen, |m| {
            let params = m.params[..m.len]
                .iter()
                .map(|(k, v)| (String::from_utf8(k.to_vec()).unwrap(), *v))
                .collect();
            out.push((m.inner_list, params));
        })?;
        Ok(out)
    }

    fn int(k: &str, v: i64) -> (String, Bare<'static>) {
        (k.to_string(), Bare::Integer(v))
    }

    #[test]
    fn items_with_integer_parameters() {
        assert_eq!(
            parse(r#""default";q=100;w=60, "daily";q=1000;w=86400"#),
            Ok(vec![
                (false, vec![int("q", 100), int("w", 60)]),
                (false, vec![int("q", 1000), int("w", 86400)]),
            ])
        );
        assert_eq!(
            parse("tok;r=0;t=5"),
            Ok(vec![(false, vec![int("r", 0), int("t", 5)])])
        );
    }

    #[test]
    fn every_bare_item_type_parses() {
        let field = r#"1, -2, 3.5, "s\"x\\", tok/a:b, :aGVsbG8=:, ?1, @1659578233, (a "b" 1);k=2"#;
        let got = parse(field).unwrap();
        assert_eq!(got.len(), 9);
        assert!(got[8].0, "the inner list is marked");
        assert_eq!(got[8].1, vec![int("k", 2)]);
        assert_eq!(
            parse("x;a;b=?0").unwrap()[0].1[0],
            ("a".into(), Bare::Other)
        );
        let texts = parse(r#"x;qu="requests";u=tok/1;e="a\"b""#).unwrap();
        let want: [&[u8]; 3] = [b"requests", b"tok/1", br#"a\"b"#];
        for (i, w) in want.iter().enumerate() {
            assert_eq!(texts[0].1[i].1, Bare::Text(w));
        }
    }

    #[test]
    fn last_duplicate_parameter_wins() {
        assert_eq!(
            parse("x;q=1;w=2;q=3"),
            Ok(vec![(false, vec![int("q", 3), int("w", 2)])])
        );
    }

    #[test]
    fn empty_and_whitespace_fields_are_empty_lists() {
        assert_eq!(parse(""), Ok(vec![]));
        assert_eq!(parse("   "), Ok(vec![]));
        assert_eq!(parse("a ,\tb").map(|v| v.len()), Ok(2));
    }

    #[test]
    fn syntax_errors_fail_the_field() {
        for bad in [
            "a,",
            ",a",
            "a,,b",
            "a b",
            "a;Q=1",
            "a;q=",
            "a;=1",
            "a;q=1.",
            "a;q=1.2345",
            "a;q=1234567890123456",
            "a;q=1234567890123.5",
            "a;q=--1",
            "\"unterminated",
            "\"bad\\escape\"",
            "\"tab\tinside\"",
            ":not base64!:",
            "?2",
            "@1.5",
            "%\"display\"",
            "(a b",
            "(a,b)",
            "é",
            "a;q=1\u{0}",
            "\ta",
        ] {
            assert_eq!(parse(bad), Err(Fail), "{bad:?}");
        }
    }

    #[test]
    fn limits_fail_the_field() {
        let members = vec!["a"; MAX_MEMBERS].join(",");
        assert_eq!(parse(&members).map(|v| v.len()), Ok(MAX_MEMBERS));
        assert_eq!(parse(&format!("{members},a")), Err(Fail));
        let params: String = (0..MAX_PARAMS).map(|i| format!(";k{i}=1")).collect();
        assert!(parse(&format!("a{params}")).is_ok());
        assert_eq!(parse(&format!("a{params};kx=1")), Err(Fail));
        let inner = format!("({})", vec!["a"; MAX_MEMBERS + 1].join(" "));
        assert_eq!(parse(&inner), Err(Fail));
        let key = "k".repeat(MAX_KEY + 1);
        assert_eq!(parse(&format!("a;{key}=1")), Err(Fail));
        assert!(parse(&format!("a;{}=1", &key[1..])).is_ok());
    }

    #[test]
    fn the_member_cap_spans_lines() {
        let mut seen = 0;
        let line = ["a"; MAX_MEMBERS / 2].join(",");
        assert!(parse_list(line.as_bytes(), &mut seen, |_| {}).is_ok());
        assert!(parse_list(line.as_bytes(), &mut seen, |_| {}).is_ok());
        assert_eq!(parse_list(b"a", &mut seen, |_| {}), Err(Fail));
    }

    #[test]
    fn uint_reads_only_non_negative_integers() {
        let mut seen = 0;
        let mut got = Vec::new();
        parse_list(b"a;q=-1;w=2.5;r=7;t", &mut seen, |m| {
            got = ["q", "w", "r", "t", "x"].map(|k| m.uint(k)).to_vec();
        })
        .unwrap();
        assert_eq!(got, vec![None, None, Some(7), None, None]);
    }
}
