//! The agent config's `template` block, as Nomad's client has it: which template
//! functions job authors may not call on this agent (`function_denylist`; Nomad's
//! default is `["plugin", "writeToFile"]`, which berth does not have at all). An
//! operator whose Consul token reads more than jobs should see denies `key`, `tree`
//! and the rest here.

use berth_hcl::Problem;
use berth_hcl::fields::Fields;
use berth_hcl::tree::BlockNode;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateSettings {
    pub function_denylist: Vec<String>,
}

impl Default for TemplateSettings {
    fn default() -> Self {
        TemplateSettings {
            function_denylist: vec!["plugin".into(), "writeToFile".into()],
        }
    }
}

impl TemplateSettings {
    /// The refusal of the first function of `functions` this agent denies.
    pub fn refusal(&self, functions: &[&str]) -> Option<String> {
        let denied = functions
            .iter()
            .find(|f| self.function_denylist.iter().any(|d| d == *f))?;
        Some(format!(
            "template function {denied:?} is denied on this agent (its template {{ \
             function_denylist }})"
        ))
    }
}

pub(super) fn template_settings(
    block: &BlockNode,
    problems: &mut Vec<Problem>,
) -> TemplateSettings {
    let mut fields = Fields::new(
        &block.body,
        "config.template".into(),
        block.at,
        &["function_denylist"],
    );
    if fields.attr("function_denylist").is_none() {
        return TemplateSettings::default();
    }
    TemplateSettings {
        function_denylist: fields.string_list("function_denylist", problems),
    }
}
