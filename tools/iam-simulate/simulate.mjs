// Evaluates recorded AWS calls against IAM identity policies, conditions included, as AWS would
// (the local stack's call log against the cloud program's documents: tests/e2e/iam_simulation.py).
//
// stdin:  {"policySets": {"<set>": {"<principal ARN>": [{"name": "...", "policy": {...}}]}},
//          "calls": [{"principal": "...", "action": "s3:ListBucket", "resource": "arn:...",
//                     "context": {"s3:prefix": "..."}}],
//          "resourcePolicies": {"<resource ARN>": {...}}}   (a KMS key's key policy, say)
// stdout: {"<set>": [{"decision": "Allowed" | "ImplicitlyDenied" | "ExplicitlyDenied" | "Error",
//                     "allowedBy": ["<policy name>/<Sid>", ...], "errors": ...}, ...one per call]}
import { runSimulation } from '@cloud-copilot/iam-simulate'

const chunks = []
for await (const chunk of process.stdin) chunks.push(chunk)
const input = JSON.parse(Buffer.concat(chunks).toString('utf8'))

async function decide(policies, call) {
  const response = await runSimulation(
    {
      identityPolicies: policies[call.principal] ?? [],
      serviceControlPolicies: [],
      resourceControlPolicies: [],
      resourcePolicy: input.resourcePolicies?.[call.resource],
      request: {
        action: call.action,
        principal: call.principal,
        resource: { accountId: call.principal.split(':')[4], resource: call.resource },
        contextVariables: call.context ?? {}
      }
    },
    {}
  )
  if (response.resultType === 'error') {
    return { decision: 'Error', allowedBy: [], errors: response.errors }
  }
  const results = response.resultType === 'single' ? [response.result] : response.results
  const allowedBy = new Set()
  for (const result of results) {
    for (const explain of result.analysis?.identityAnalysis?.allowStatements ?? []) {
      allowedBy.add(`${explain.policyId ?? ''}/${explain.explain?.identifier ?? ''}`)
    }
  }
  return { decision: response.overallResult, allowedBy: [...allowedBy] }
}

const out = {}
for (const [name, policies] of Object.entries(input.policySets)) {
  out[name] = []
  for (const call of input.calls) out[name].push(await decide(policies, call))
}
process.stdout.write(JSON.stringify(out) + '\n')
