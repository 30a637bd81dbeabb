#!/usr/bin/env python3
# Templated business documents (JSONL, a "text" field) for a router run
# before the redactor's corpus (`myriad redact-tools corpus`) is at hand:
#   python3 scripts/route_demo_docs.py > docs.jsonl
import json, random

random.seed(7)
names = ["Li Wei", "Maria Gomez", "Zhang Min", "John Smith", "Wang Fang", "Ana Silva", "Chen Jie", "Bob Stone"]
orgs = ["Acme Ltd", "Northwind Traders", "Contoso", "Globex", "Initech", "星河科技有限公司", "华为", "Umbrella Corp"]
templates = [
    "Quarterly report: revenue for {o} rose {p}% to {a}M. The customer {n} paid invoice INV-{i} on {d} May. Contact {e}.",
    "Contract summary: {o} agrees to deliver {u} units to {o2} by {d} July; late payment incurs {p}% a month. Signed by {n}.",
    "Meeting minutes: the account for {o} was reviewed; budget of {a}M approved; action items assigned to {n} ({e}).",
    "Invoice dispute: customer {n} says invoice {i} from {o} double-charged {u} USD; the account manager will reply by {d} June.",
    "会议纪要：{n}与{o}签订合同，金额 {u} 万元，付款期限 {d} 天，联系电话 1381234{i}。",
    "客户投诉报告：订单 2026{i} 延迟送达，客户{n}要求退款 {u} 元。",
]
for k in range(160):
    t = random.choice(templates).format(
        o=random.choice(orgs), o2=random.choice(orgs), n=random.choice(names), p=random.randint(2, 30),
        a=random.randint(1, 90) / 10, i=random.randint(1000, 9999), d=random.randint(1, 28), u=random.randint(10, 900),
        e="user%d@example.com" % k)
    print(json.dumps({"text": t}, ensure_ascii=False))
