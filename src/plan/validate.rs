//! Rejecting a request that Envoy never sends before any bucket: an empty or over-long
//! domain, no descriptors, more descriptors or entries than [`RequestLimits`] allows, an empty
//! key. Each comes from the operator's Envoy configuration, never from a client (the table in
//! docs/security.md, "Requests Envoy builds from what a client sends"). A key or value over
//! [`RequestLimits::max_value_len`], which a client does control, is not refused: the planner
//! matches it in full and knows it by its digest from then on (`build`).

use super::*;

pub(super) fn validate(
    request: &RateLimitRequest,
    limits: &RequestLimits,
) -> Result<(), InvalidRequest> {
    let invalid = |message: String| Err(InvalidRequest(message));
    if request.domain.is_empty() {
        return invalid("rate limit domain must not be empty".into());
    }
    if request.domain.len() > limits.max_value_len {
        return invalid(format!(
            "rate limit domain is {} bytes long; at most {} are allowed (--max-value-bytes)",
            request.domain.len(),
            limits.max_value_len
        ));
    }
    if request.descriptors.is_empty() {
        return invalid("rate limit descriptor list must not be empty".into());
    }
    if request.descriptors.len() > limits.max_descriptors {
        return invalid(format!(
            "request has {} descriptors; at most {} are allowed (--max-descriptors)",
            request.descriptors.len(),
            limits.max_descriptors
        ));
    }
    for (i, descriptor) in request.descriptors.iter().enumerate() {
        // A descriptor without entries is valid: the reference matches it against nothing
        // and answers it OK with no limit (or applies its `limit` override).
        if descriptor.entries.len() > limits.max_entries {
            return invalid(format!(
                "descriptors[{i}] has {} entries; at most {} are allowed (--max-entries)",
                descriptor.entries.len(),
                limits.max_entries
            ));
        }
        for (j, entry) in descriptor.entries.iter().enumerate() {
            if entry.key.is_empty() {
                return invalid(format!(
                    "descriptors[{i}].entries[{j}].key must not be empty"
                ));
            }
        }
    }
    Ok(())
}
