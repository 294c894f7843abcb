//! keel's local selector line protocol (`../shared/reference/keel-integration.md`, section 1):
//! requests in, framed replies out, and keel's own reply checks, which every reply is held to
//! before it is written.

use serde_json::Value;

/// What every reply line starts with.
pub const PREFIX: &str = "KEEL_LAYA_JSON:";
/// The pseudo-candidate keel appends to every request.
pub const ESCALATE: &str = "escalate";
/// The handshake keel requires, byte for byte.
pub const READY: &str = r#"{"ready":true,"model":"laya-coreml"}"#;
pub const UNAVAILABLE: &str = r#"{"ready":false,"error":"model_unavailable"}"#;
pub const CAPACITY: &str = r#"{"error":"capacity"}"#;
pub const INFERENCE: &str = r#"{"error":"inference"}"#;

/// keel's gates after its checks (constants in its code, the same for every stage).
pub const KEEL_MIN_PROBABILITY: f64 = 0.4;
pub const KEEL_MIN_CONFIDENCE: f64 = 0.1;
pub const KEEL_MIN_MARGIN: f64 = 0.05;

/// A reply as written: a leading newline (other output may have ended without one), the prefix,
/// the JSON, a newline. This is how the Laya worker frames its lines.
pub fn frame(json: &str) -> String {
    format!("\n{PREFIX}{json}\n")
}

/// A request: the state text (our context) and the candidates, `escalate` removed.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub state: String,
    /// (id, description) in the host's order.
    pub candidates: Vec<(String, String)>,
}

impl Request {
    pub fn ids(&self) -> Vec<&str> {
        self.candidates.iter().map(|(id, _)| id.as_str()).collect()
    }
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// Parse one request line. The error says why it is not a valid request (for the log; keel is
/// only ever told `inference`).
pub fn parse_request(line: &[u8]) -> Result<Request, String> {
    let v: Value = serde_json::from_slice(line).map_err(|e| format!("not JSON: {e}"))?;
    let obj = v.as_object().ok_or("not a JSON object")?;
    let state = obj
        .get("state")
        .and_then(Value::as_str)
        .ok_or("`state` is missing or not a string")?
        .to_string();
    let criteria = obj
        .get("criteria")
        .and_then(Value::as_array)
        .ok_or("`criteria` is missing or not a list")?;
    let mut candidates = Vec::with_capacity(criteria.len());
    for (i, c) in criteria.iter().enumerate() {
        let pair = c.as_array().filter(|a| a.len() == 2);
        let (id, desc) = match pair.map(|a| (a[0].as_str(), a[1].as_str())) {
            Some((Some(id), Some(desc))) => (id, desc),
            _ => {
                return Err(format!(
                    "criteria[{i}] is not [id, description] (two strings)"
                ));
            }
        };
        if id == ESCALATE {
            continue;
        }
        if !valid_id(id) {
            return Err(format!(
                "criteria[{i}]: id {id:?} is not 1-64 characters of [A-Za-z0-9_.-]"
            ));
        }
        if desc.trim().is_empty() {
            return Err(format!("criteria[{i}] ({id}): empty description"));
        }
        if candidates.iter().any(|(c, _): &(String, String)| c == id) {
            return Err(format!("criteria[{i}]: id {id:?} appears twice"));
        }
        candidates.push((id.to_string(), desc.to_string()));
    }
    if candidates.is_empty() {
        return Err("no candidates besides escalate".into());
    }
    Ok(Request { state, candidates })
}

/// A decision reply: `probabilities` keyed by the candidate ids in order, then `escalate`.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub choice: String,
    pub probabilities: Vec<(String, f64)>,
    pub confidence: f64,
}

impl Decision {
    /// Pick candidate `pick` (`p` are the calibrated probabilities, summing to 1): the
    /// candidates carry `p`, `escalate` carries 0.
    pub fn pick(ids: &[&str], p: &[f64], pick: usize) -> Self {
        let mut probabilities: Vec<(String, f64)> = ids
            .iter()
            .zip(p)
            .map(|(id, &x)| (id.to_string(), x))
            .collect();
        probabilities.push((ESCALATE.into(), 0.0));
        Self {
            choice: ids[pick].to_string(),
            probabilities,
            confidence: p[pick],
        }
    }

    /// Escalate. keel needs `p[escalate]` to be the largest value, so the candidates' calibrated
    /// probabilities are divided by `1 + p_max` and `escalate` gets `p_max / (1 + p_max)`: the sum
    /// stays 1, the candidates keep their ratios, and `escalate` ties the top candidate exactly
    /// (the same expression). `confidence` is the top candidate's calibrated probability.
    pub fn escalate(ids: &[&str], p: &[f64]) -> Self {
        let pmax = p.iter().cloned().fold(0.0, f64::max);
        let d = 1.0 + pmax;
        let mut probabilities: Vec<(String, f64)> = ids
            .iter()
            .zip(p)
            .map(|(id, &x)| (id.to_string(), x / d))
            .collect();
        probabilities.push((ESCALATE.into(), pmax / d));
        Self {
            choice: ESCALATE.into(),
            probabilities,
            confidence: pmax,
        }
    }

    pub fn to_json(&self) -> String {
        let mut s = String::from("{\"choice\":");
        s.push_str(&Value::from(self.choice.as_str()).to_string());
        s.push_str(",\"probabilities\":{");
        for (i, (id, p)) in self.probabilities.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str(&Value::from(id.as_str()).to_string());
            s.push(':');
            s.push_str(&number(*p));
        }
        s.push_str("},\"confidence\":");
        s.push_str(&number(self.confidence));
        s.push('}');
        s
    }

    /// keel's checks, in its order ([`keel_check`]).
    pub fn check(&self, ids: &[&str]) -> Result<KeelVerdict, String> {
        keel_check(ids, &self.choice, &self.probabilities, self.confidence)
    }
}

/// A finite f64 as JSON (serde_json's shortest round-trip form; never NaN, which JSON lacks).
fn number(x: f64) -> String {
    serde_json::Number::from_f64(x)
        .map(|n| n.to_string())
        .unwrap_or_else(|| "null".into())
}

/// What keel does with a reply that passed its checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeelVerdict {
    Taken,
    Abstained,
    /// keel's `LowProbability`: `p[choice] < 0.4`.
    LowProbability,
    /// `confidence < 0.1`.
    LowConfidence,
    /// keel's `Ambiguous`: `p[choice] − runner-up < 0.05` (runner-up over every key).
    Ambiguous,
}

impl KeelVerdict {
    /// The name keel's receipts use for the fallback (its enum names).
    pub fn fallback_name(self) -> Option<&'static str> {
        match self {
            KeelVerdict::LowProbability => Some("LowProbability"),
            KeelVerdict::LowConfidence => Some("LowConfidence"),
            KeelVerdict::Ambiguous => Some("Ambiguous"),
            _ => None,
        }
    }
}

/// keel's reply checks, in order, then its gates: the key set is the candidate ids plus
/// `escalate` and `choice` is one of them; every p finite in [0, 1], |Σp − 1| ≤ 0.01;
/// `p[choice] + 1e-8 ≥ max p`; confidence in [0, 1]. `Err` is a reply keel refuses.
pub fn keel_check(
    ids: &[&str],
    choice: &str,
    probabilities: &[(String, f64)],
    confidence: f64,
) -> Result<KeelVerdict, String> {
    let mut want: Vec<&str> = ids.to_vec();
    want.push(ESCALATE);
    want.sort_unstable();
    let mut got: Vec<&str> = probabilities.iter().map(|(k, _)| k.as_str()).collect();
    got.sort_unstable();
    if got != want {
        return Err(format!("key set {got:?} is not {want:?}"));
    }
    let Some(&(_, pc)) = probabilities.iter().find(|(k, _)| k == choice) else {
        return Err(format!("choice {choice:?} is not a key"));
    };
    if probabilities
        .iter()
        .any(|(_, p)| !(p.is_finite() && (0.0..=1.0).contains(p)))
    {
        return Err("a probability is not finite in [0, 1]".into());
    }
    let sum: f64 = probabilities.iter().map(|(_, p)| p).sum();
    if (sum - 1.0).abs() > 0.01 {
        return Err(format!("probabilities sum to {sum}"));
    }
    let max = probabilities.iter().map(|(_, p)| *p).fold(0.0, f64::max);
    if pc + 1e-8 < max {
        return Err(format!("p[choice] = {pc} is below the largest, {max}"));
    }
    if !(confidence.is_finite() && (0.0..=1.0).contains(&confidence)) {
        return Err(format!("confidence {confidence} is not in [0, 1]"));
    }
    if choice == ESCALATE {
        return Ok(KeelVerdict::Abstained);
    }
    if pc < KEEL_MIN_PROBABILITY {
        return Ok(KeelVerdict::LowProbability);
    }
    if confidence < KEEL_MIN_CONFIDENCE {
        return Ok(KeelVerdict::LowConfidence);
    }
    let runner_up = probabilities
        .iter()
        .filter(|(k, _)| k != choice)
        .map(|(_, p)| *p)
        .fold(0.0, f64::max);
    if pc - runner_up < KEEL_MIN_MARGIN {
        return Ok(KeelVerdict::Ambiguous);
    }
    Ok(KeelVerdict::Taken)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_drop_escalate_and_bad_ones_are_named() {
        let r = parse_request(
            br#"{"state":"task: t\ncontext: c","criteria":[["a","do a"],["b.2","do b"],["escalate","None of these steps helps the task"]]}"#,
        )
        .unwrap();
        assert_eq!(r.state, "task: t\ncontext: c");
        assert_eq!(r.ids(), ["a", "b.2"]);
        for (line, want) in [
            (&b"not json"[..], "not JSON"),
            (br#"[1]"#, "object"),
            (br#"{"criteria":[]}"#, "state"),
            (br#"{"state":"s","criteria":[["a"]]}"#, "criteria[0]"),
            (
                br#"{"state":"s","criteria":[["a","x"],["a","y"]]}"#,
                "twice",
            ),
            (br#"{"state":"s","criteria":[["a b","x"]]}"#, "A-Za-z0-9"),
            (
                br#"{"state":"s","criteria":[["a"," "]]}"#,
                "empty description",
            ),
            (
                br#"{"state":"s","criteria":[["escalate","x"]]}"#,
                "no candidates",
            ),
        ] {
            let e = parse_request(line).unwrap_err();
            assert!(e.contains(want), "{}: {e}", String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn picks_and_escalations_pass_keel_by_construction() {
        let ids = ["a", "b", "c"];
        let p = [0.7, 0.2, 0.1];
        let d = Decision::pick(&ids, &p, 0);
        assert_eq!(d.check(&ids), Ok(KeelVerdict::Taken));
        assert_eq!(
            d.to_json(),
            r#"{"choice":"a","probabilities":{"a":0.7,"b":0.2,"c":0.1,"escalate":0.0},"confidence":0.7}"#
        );
        let e = Decision::escalate(&ids, &p);
        assert_eq!(e.check(&ids), Ok(KeelVerdict::Abstained));
        let esc = e.probabilities.last().unwrap().1;
        assert_eq!(esc, e.probabilities[0].1, "escalate ties the top candidate");
        assert!((e.probabilities[1].1 / e.probabilities[2].1 - 2.0).abs() < 1e-12);
        // keel's gates, where our threshold could accept what keel vetoes.
        let low = Decision::pick(&ids, &[0.39, 0.31, 0.30], 0);
        assert_eq!(low.check(&ids), Ok(KeelVerdict::LowProbability));
        let close = Decision::pick(&ids, &[0.5, 0.46, 0.04], 0);
        assert_eq!(close.check(&ids), Ok(KeelVerdict::Ambiguous));
        // Above 0.525 no gate can fire: the runner-up is at most 1 - p.
        let safe = Decision::pick(&ids, &[0.526, 0.474, 0.0], 0);
        assert_eq!(safe.check(&ids), Ok(KeelVerdict::Taken));
        // What keel refuses.
        let mut bad = d.clone();
        bad.probabilities.pop();
        assert!(bad.check(&ids).is_err());
        let mut bad = d.clone();
        bad.choice = "b".into();
        assert!(bad.check(&ids).unwrap_err().contains("below the largest"));
    }
}
