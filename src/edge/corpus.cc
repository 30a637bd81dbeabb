#include "edge/corpus.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/checksum.h"
#include "core/env.h"
#include "core/rng.h"
#include "edge/checksums.h"

namespace myriad::edge {

namespace {

// ---- Lexicons. Each entry goes to the held-out side when the hash of
// (category, entry) falls in the lowest fifth; closed classes go to both.

struct Category {
  const char* name;
  std::vector<std::string> entries;
};

const std::vector<Category>& AllLexicons() {
  static const std::vector<Category> k = {
      {"cn_surname",
       {"王", "李", "张", "刘", "陈", "杨", "黄", "赵", "吴", "周", "徐", "孙", "马", "朱", "胡", "郭", "何",
        "高", "林", "罗", "郑", "梁", "谢", "宋", "唐", "许", "韩", "冯", "邓", "曹", "彭", "曾", "肖", "田",
        "董", "袁", "潘", "于", "蒋", "蔡", "余", "杜", "叶", "程", "苏", "魏", "吕", "丁", "任", "沈", "姚",
        "卢", "姜", "崔", "钟", "谭", "陆", "汪", "范", "金", "石", "廖", "贾", "夏", "韦", "付", "方", "白",
        "邹", "孟", "熊", "秦", "邱", "江", "尹", "薛", "闫", "段", "雷", "侯", "龙", "史", "欧阳", "司马"}},
      {"cn_given",
       {"伟", "芳", "娜", "秀英", "敏", "静", "丽", "强", "磊", "军", "洋", "勇", "艳", "杰", "娟", "涛",
        "明", "超", "秀兰", "霞", "平", "刚", "桂英", "建华", "文", "华", "金凤", "晓东", "志强", "海燕",
        "子涵", "浩然", "雨桐", "欣怡", "梓萱", "宇轩", "思远", "嘉怡", "俊杰", "佳琪", "一鸣", "若曦",
        "国强", "建国", "春梅", "晓红", "丹", "鹏", "辉", "玲", "婷", "颖", "宁", "博", "慧", "晨", "瑶",
        "志明", "美玲", "家豪", "振宇", "晓燕", "立新", "红梅", "少华", "雪莉", "天佑", "梦琪", "文博",
        "子轩", "诗琪", "昊天", "雅婷", "伟东", "凯", "斌", "亮", "倩", "琳", "翔", "昕", "璐", "彬"}},
      {"en_first",
       {"James", "Mary", "John", "Patricia", "Robert", "Jennifer", "Michael", "Linda", "William", "Elizabeth",
        "David", "Barbara", "Richard", "Susan", "Joseph", "Jessica", "Thomas", "Sarah", "Charles", "Karen",
        "Daniel", "Nancy", "Matthew", "Lisa", "Anthony", "Betty", "Mark", "Margaret", "Steven", "Sandra",
        "Paul", "Ashley", "Andrew", "Emily", "Joshua", "Donna", "Kevin", "Michelle", "Brian", "Carol",
        "George", "Amanda", "Edward", "Melissa", "Ronald", "Deborah", "Timothy", "Stephanie", "Jason",
        "Rebecca", "Ryan", "Laura", "Jacob", "Helen", "Gary", "Sharon", "Oliver", "Chloe", "Ethan", "Grace",
        "Lucas", "Hannah", "Owen", "Zoe", "Henry", "Alice", "Samuel", "Ruby", "Noah", "Ivy"}},
      {"en_last",
       {"Smith", "Johnson", "Williams", "Brown", "Jones", "Garcia", "Miller", "Davis", "Rodriguez", "Martinez",
        "Hernandez", "Lopez", "Wilson", "Anderson", "Taylor", "Thomas", "Moore", "Jackson", "Martin", "Lee",
        "Thompson", "White", "Harris", "Clark", "Lewis", "Robinson", "Walker", "Young", "Allen", "King",
        "Wright", "Scott", "Green", "Baker", "Adams", "Nelson", "Hill", "Campbell", "Mitchell", "Roberts",
        "Carter", "Phillips", "Evans", "Turner", "Torres", "Parker", "Collins", "Edwards", "Stewart",
        "Morris", "Murphy", "Cook", "Rogers", "Morgan", "Peterson", "Cooper", "Reed", "Bailey", "Bell",
        "Hughes", "Fletcher", "Barnes", "Fisher", "Hayes", "Palmer", "Hudson", "Sutton", "Warren"}},
      {"cn_place",
       {"广东省深圳市南山区", "广东省深圳市福田区", "广东省广州市天河区", "广东省广州市越秀区", "广东省东莞市南城街道",
        "北京市朝阳区", "北京市海淀区", "北京市东城区", "北京市丰台区", "上海市浦东新区", "上海市徐汇区",
        "上海市静安区", "上海市闵行区", "天津市和平区", "天津市南开区", "重庆市渝中区", "重庆市江北区",
        "浙江省杭州市西湖区", "浙江省杭州市滨江区", "浙江省宁波市鄞州区", "江苏省南京市鼓楼区", "江苏省苏州市工业园区",
        "江苏省无锡市梁溪区", "四川省成都市武侯区", "四川省成都市高新区", "湖北省武汉市洪山区", "湖北省武汉市江汉区",
        "湖南省长沙市岳麓区", "山东省青岛市市南区", "山东省济南市历下区", "福建省厦门市思明区", "福建省福州市鼓楼区",
        "陕西省西安市雁塔区", "河南省郑州市金水区", "辽宁省沈阳市和平区", "辽宁省大连市中山区", "安徽省合肥市蜀山区",
        "云南省昆明市五华区", "广西壮族自治区南宁市青秀区", "河北省石家庄市长安区", "江西省南昌市东湖区",
        "吉林省长春市朝阳区", "黑龙江省哈尔滨市南岗区", "贵州省贵阳市观山湖区", "海南省海口市龙华区"}},
      {"cn_road",
       {"科技园路", "深南大道", "中山路", "人民路", "解放路", "建设路", "和平路", "新华路", "长江路", "黄河路",
        "学府路", "文化路", "朝阳路", "南京路", "北京路", "延安路", "淮海中路", "滨江大道", "天府大道",
        "高新南一道", "软件园二路", "创业大道", "望京街", "中关村大街", "知春路", "五四路", "湖滨路",
        "东风路", "金融街", "世纪大道", "春熙路", "珠江路", "友谊路", "光明路", "迎宾大道", "东湖路",
        "西湖大道", "青年路", "胜利街", "花园路", "工业大道", "环城北路", "民主路", "振兴路", "前进路"}},
      {"en_street",
       {"Harbor", "Maple", "Oak", "Pine", "Cedar", "Elm", "Washington", "Lake", "Hill", "Park", "Main",
        "Sunset", "River", "Spring", "Church", "Highland", "Meadow", "Forest", "Willow", "Jefferson",
        "Madison", "Franklin", "Lincoln", "Chestnut", "Walnut", "Birch", "Mission", "Market", "Valencia",
        "Broadway", "Lexington", "Kingsley", "Ashford", "Brookside", "Fairview", "Greenwood", "Ridgeway",
        "Summit", "Orchard", "Bayview", "Clifton", "Dover", "Hampton", "Juniper", "Magnolia"}},
      {"en_city",
       {"Springfield, IL 62704", "Portland, OR 97205", "Austin, TX 78701", "Denver, CO 80202",
        "Seattle, WA 98101", "Boston, MA 02108", "San Francisco, CA 94103", "Chicago, IL 60601",
        "Phoenix, AZ 85004", "Columbus, OH 43215", "Madison, WI 53703", "Raleigh, NC 27601",
        "Nashville, TN 37203", "Salt Lake City, UT 84101", "Richmond, VA 23219", "Albany, NY 12207",
        "Tampa, FL 33602", "Omaha, NE 68102", "Boise, ID 83702", "Tucson, AZ 85701", "Hartford, CT 06103",
        "Burlington, VT 05401", "Savannah, GA 31401", "Eugene, OR 97401", "Ann Arbor, MI 48104",
        "Pittsburgh, PA 15222", "Sacramento, CA 95814", "Dayton, OH 45402", "Fresno, CA 93721",
        "Lincoln, NE 68508", "Reno, NV 89501", "Tulsa, OK 74103", "Spokane, WA 99201", "Mobile, AL 36602"}},
      {"org_brand",
       {"腾达", "华信", "恒通", "鼎盛", "金桥", "星辰", "宏远", "博雅", "瑞丰", "安泰", "嘉禾", "中联",
        "盛世", "天元", "汇丰达", "新纪元", "远航", "蓝海", "云帆", "智源", "长城", "东方红", "海川", "明德",
        "泰和", "永信", "万象", "凯旋", "银河", "晨光", "联创", "卓越", "华夏通", "同舟", "锦程", "开元",
        "信达", "广源", "思创", "启明", "飞鸿", "润泽", "中恒", "德润", "北辰", "南粤", "佳禾", "众诚",
        "鑫源", "旭日", "青松", "聚能", "和信", "国泰", "安吉", "宝华", "富民", "兴业达", "汇通", "祥瑞"}},
      {"en_org_word",
       {"Northwind", "Bluefin", "Contoso", "Fabrikam", "Litware", "Tailspin", "Wingtip", "Adventure Works",
        "Proseware", "Lucerne", "Margie", "Woodgrove", "Alpine Ski", "Coho", "Graphic Design", "Humongous",
        "Trey Research", "Blue Yonder", "Fourth Coffee", "Southridge", "Wide World", "Silverline", "Redwood",
        "Ironbridge", "Brightwater", "Stonegate", "Oakhurst", "Kestrel", "Harborview", "Summitpeak", "Granite",
        "Evergreen", "Lakeshore", "Pinecrest", "Crescent", "Falcon", "Meridian", "Horizon", "Sterling",
        "Cobalt", "Juniper", "Vantage", "Beacon", "Atlas", "Orion", "Sequoia", "Harlow", "Ashgrove"}},
  };
  return k;
}

bool HeldOutEntry(std::string_view category, std::string_view entry) {
  std::string key = std::string(category) + "\x1f" + std::string(entry);
  return Checksum64(key) % 5 == 0;
}

}  // namespace

// Chinese surnames are a closed class (a device ships the list): both splits
// use all of them; names stay disjoint through their given names.
bool IsClosedLexicon(std::string_view category) { return category == "cn_surname"; }

namespace {

struct SplitLexicons {
  std::map<std::string, std::vector<std::string>> part[2];
};

const SplitLexicons& Lexicons() {
  static const SplitLexicons k = [] {
    SplitLexicons s;
    for (const Category& c : AllLexicons())
      for (const std::string& e : c.entries) {
        if (IsClosedLexicon(c.name)) {
          s.part[0][c.name].push_back(e);
          s.part[1][c.name].push_back(e);
        } else {
          s.part[HeldOutEntry(c.name, e) ? 1 : 0][c.name].push_back(e);
        }
      }
    return s;
  }();
  return k;
}

// ---- Building a document: text plus spans in code points.

constexpr const char* kZeroWidth = "\u200b";

int64_t CodePoints(std::string_view s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::string FullWidthDigits(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c >= '0' && c <= '9')
      out += EncodeUtf8(std::u32string(1, static_cast<char32_t>(0xFF10 + (c - '0'))));
    else
      out += c;
  }
  return out;
}

struct Value {
  std::string text;
  std::optional<EntityType> type;  // planted entity (or the imitated type of a decoy)
  bool decoy = false;
};

Value Plain(std::string s) { return Value{std::move(s), std::nullopt, false}; }

class Generator {
 public:
  Generator(uint64_t seed, Split split, int64_t index)
      : rng_(seed * 0x9E3779B97F4A7C15ULL ^ (static_cast<uint64_t>(index) * 0xD1B54A32D192ED03ULL) ^
             (split == Split::kHeldOut ? 0x5bd1e995ULL : 0)),
        lex_(Lexicons().part[split == Split::kHeldOut ? 1 : 0]) {}

  LabelledDoc Make() {
    static const char* kKinds[] = {"report", "email", "table", "chat", "ticket"};
    static const char* kLangs[] = {"zh", "en", "mixed"};
    LabelledDoc d;
    d.kind = kKinds[rng_.Below(5)];
    d.lang = kLangs[rng_.Below(3)];
    lang_ = d.lang;
    for (const std::string& t : Templates(d.kind)) Expand(t);
    d.text = std::move(text_);
    d.spans = std::move(spans_);
    d.decoys = std::move(decoys_);
    return d;
  }

 private:
  uint64_t Below(uint64_t n) { return rng_.Below(n); }
  bool Chance(float p) { return rng_.Uniform() < p; }
  template <class T>
  const T& Pick(const std::vector<T>& v) { return v[Below(v.size())]; }
  const std::string& Lex(const char* cat) { return Pick(lex_.at(cat)); }
  std::string Digits(int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += static_cast<char>('0' + Below(10));
    return s;
  }
  std::string Num(int lo, int hi) { return std::to_string(lo + static_cast<int>(Below(hi - lo + 1))); }
  std::string Pad(int v, int w) {
    std::string s = std::to_string(v);
    while (static_cast<int>(s.size()) < w) s = "0" + s;
    return s;
  }
  bool Zh() { return lang_ == "zh" || (lang_ == "mixed" && Chance(0.5f)); }
  bool ZhText() { return lang_ != "en"; }

  // Digits written in full width, or with a zero-width space inside, now and then.
  std::string Obfuscate(std::string s) {
    if (Chance(0.08f)) s = FullWidthDigits(s);
    if (Chance(0.08f) && s.size() > 2) {
      const size_t at = 1 + Below(s.size() - 2);
      if ((static_cast<unsigned char>(s[at]) & 0xC0) != 0x80) s.insert(at, kZeroWidth);
    }
    return s;
  }

  // ---- Entities.
  std::string PersonZh() { return Lex("cn_surname") + Lex("cn_given"); }
  std::string PersonEn() {
    if (Chance(0.15f)) return Lex("en_first").substr(0, 1) + ". " + Lex("en_last");
    return Lex("en_first") + " " + Lex("en_last");
  }
  std::string AddressZh() {
    std::string a = Lex("cn_place") + Lex("cn_road") + Num(1, 999) + "号";
    const uint64_t r = Below(3);
    if (r == 0) a += Num(1, 30) + "栋" + Num(1, 32) + Pad(static_cast<int>(Below(20)) + 1, 2) + "室";
    if (r == 1) a += Pick(std::vector<std::string>{"A座", "B座", "科技大厦", "国际中心"}) + Num(2, 40) + "层";
    return a;
  }
  std::string AddressEn() {
    static const std::vector<std::string> kSuffix = {"Street", "Avenue", "Road", "Boulevard", "Lane", "Drive", "St.",
                                                     "Ave."};
    std::string a = Num(10, 9999) + " " + Lex("en_street") + " " + Pick(kSuffix);
    if (Chance(0.35f)) a += Chance(0.5f) ? ", Suite " + Num(100, 990) : ", Apt " + Num(1, 40);
    return a + ", " + Lex("en_city");
  }
  std::string OrgZh() {
    static const std::vector<std::string> kSuffix = {"科技有限公司", "贸易有限公司", "物流股份有限公司",
                                                     "信息技术有限公司", "电子有限公司", "咨询服务有限公司"};
    static const std::vector<std::string> kCity = {"深圳", "广州", "北京", "上海", "杭州", "成都", "武汉", "南京"};
    const uint64_t r = Below(4);
    if (r == 0) return Lex("org_brand") + "银行" + Pick(kCity) + Pick(std::vector<std::string>{"分行", "支行", "营业部"});
    if (r == 1) return Pick(kCity) + "市" + Lex("org_brand") + Pick(kSuffix);
    return Pick(kCity) + Lex("org_brand") + Pick(kSuffix);
  }
  std::string OrgEn() {
    static const std::vector<std::string> kField = {"Logistics", "Analytics", "Systems", "Trading", "Holdings",
                                                    "Software", "Foods", "Capital", "Medical", "Energy"};
    static const std::vector<std::string> kSuffix = {"Ltd.", "Inc.", "LLC", "Co.", "Group", "Corporation"};
    if (Chance(0.15f)) return Lex("en_org_word") + " Bank";
    return Lex("en_org_word") + " " + Pick(kField) + " " + Pick(kSuffix);
  }
  std::string ResidentId() {
    static const std::vector<std::string> kRegion = {"110105", "440300", "310115", "330106", "510107", "420111",
                                                     "320102", "440106", "370202", "610113"};
    const std::string region = Pick(kRegion);
    const int y = 1950 + static_cast<int>(Below(56)), m = 1 + static_cast<int>(Below(12)),
              dd = 1 + static_cast<int>(Below(28));
    if (Chance(0.15f)) return region + Pad(y % 100, 2) + Pad(m, 2) + Pad(dd, 2) + Digits(3);  // 15-digit
    const std::string body = region + std::to_string(y) + Pad(m, 2) + Pad(dd, 2) + Digits(3);
    return body + *ResidentIdCheckChar(body);
  }
  std::string BadResidentId() {
    std::string id;
    do id = ResidentId(); while (id.size() != 18);
    const char good = id[17];
    static const char kChars[] = "0123456789X";
    char bad;
    do bad = kChars[Below(11)]; while (bad == good);
    id[17] = bad;
    return id;
  }
  std::string Mobile() {
    static const std::vector<std::string> kPre = {"138", "139", "136", "135", "150", "151", "158", "186",
                                                  "187", "177", "199", "131", "133", "189"};
    return Pick(kPre) + Digits(8);
  }
  // Mainland area codes as they exist: 010, 02x, and 0 + three digits from 3xx to 9xx.
  std::string AreaCode() {
    switch (Below(3)) {
      case 0: return "010";
      case 1: return "02" + Digits(1);
      default: return "0" + Num(311, 999);
    }
  }
  std::string Phone() {
    const std::string m = Mobile();
    switch (Below(9)) {
      case 0: return "+86 " + m.substr(0, 3) + "-" + m.substr(3, 4) + "-" + m.substr(7);
      case 1: return m.substr(0, 3) + " " + m.substr(3, 4) + " " + m.substr(7);
      case 2: return FullWidthDigits(m);
      case 3: return "(" + AreaCode() + ")-" + Digits(4) + " " + Digits(4);
      case 4: return AreaCode() + "-" + Digits(8);
      case 5: return "+44 20 " + Digits(4) + " " + Digits(4);
      case 6: return "(" + Num(201, 989) + ") 555-" + Digits(4);
      case 7: return "+1 " + Num(201, 989) + "-" + Digits(3) + "-" + Digits(4);
      default: return m;
    }
  }
  std::string Card() {
    std::string body;
    const uint64_t r = Below(3);
    if (r == 0) body = "62" + Digits(13 + static_cast<int>(Below(4)));  // 16..19 with the check digit
    if (r == 1) body = "4" + Digits(14);
    if (r == 2) body = "5" + Num(1, 5) + Digits(13);
    std::string card = body + *LuhnCheckDigit(body);
    if (Chance(0.4f)) {
      std::string spaced;
      for (size_t i = 0; i < card.size(); ++i) spaced += (i && i % 4 == 0 ? " " : "") + std::string(1, card[i]);
      card = spaced;
    }
    return card;
  }
  std::string Email() {
    static const std::vector<std::string> kLocal = {"zhang.wei", "li.na", "wang_fang", "chen88", "liu.yang",
                                                    "j.smith", "mary.jones", "dbrown", "service", "hr.dept",
                                                    "wu.min2020", "sales-east", "k.tanaka", "emily.c"};
    static const std::vector<std::string> kDomain = {"example.com", "mail.example.cn", "corp.example.org",
                                                     "163.com", "qq.com", "outlook.com", "gmail.com",
                                                     "northwind.example", "company.com.cn"};
    return Pick(kLocal) + (Chance(0.3f) ? Num(1, 99) : "") + "@" + Pick(kDomain);
  }
  std::string Url() {
    static const std::vector<std::string> kHost = {"portal.example.com", "www.example.cn", "crm.corp.example",
                                                   "docs.example.org", "oa.company.com.cn", "files.example.net"};
    static const std::vector<std::string> kPath = {"/ticket/view", "/order", "/share", "/u/profile",
                                                   "/report/weekly", "/d/file"};
    return std::string(Chance(0.8f) ? "https://" : "http://") + Pick(kHost) + Pick(kPath) +
           (Chance(0.6f) ? "?id=" + Digits(6) : "/" + Digits(4));
  }
  std::string Ip() {
    if (Chance(0.25f)) {
      std::ostringstream o;
      o << "2001:db8:" << std::hex << Below(65536) << ":" << Below(65536) << "::" << Below(65536) << ":"
        << Below(65536);
      return o.str();
    }
    const uint64_t r = Below(3);
    std::string head = r == 0 ? "192.168." : r == 1 ? "10." + Num(0, 255) + "." : Num(11, 223) + "." + Num(0, 255) + ".";
    return head + Num(0, 255) + "." + Num(1, 254);
  }
  std::string Passport() {
    static const std::vector<std::string> kLetter = {"E", "G", "P", "EA", "K"};
    const std::string l = Pick(kLetter);
    return l + Digits(l.size() == 1 ? 8 : 7);
  }
  std::string Plate() {
    static const std::vector<std::string> kProv = {"粤", "京", "沪", "浙", "苏", "川", "鄂", "湘", "鲁", "闽"};
    static const char kLetters[] = "ABCDEFGHJKLMNPQRSTUVWXY";
    std::string p = Pick(kProv) + std::string(1, kLetters[Below(23)]);
    if (Chance(0.3f)) return p + (Chance(0.5f) ? "D" : "F") + Digits(5);  // new energy
    std::string tail;
    for (int i = 0; i < 5; ++i) tail += Chance(0.2f) ? kLetters[Below(23)] : static_cast<char>('0' + Below(10));
    return p + (Chance(0.5f) ? "·" : "") + tail;
  }
  std::string CreditCode() {
    static const char kAlphabet[] = "0123456789ABCDEFGHJKLMNPQRTUWXY";
    static const std::vector<std::string> kRegion = {"440300", "110105", "310115", "330106", "510107"};
    std::string body = std::string(Chance(0.8f) ? "91" : "92") + Pick(kRegion);
    for (int i = 0; i < 9; ++i) body += kAlphabet[Below(31)];
    return body + *CreditCodeCheckChar(body);
  }
  std::string Ssn() {
    int area;
    do area = 1 + static_cast<int>(Below(899)); while (area == 666);
    return Pad(area, 3) + "-" + Pad(1 + static_cast<int>(Below(99)), 2) + "-" + Pad(1 + static_cast<int>(Below(9999)), 4);
  }
  // ---- Decoys.
  std::string OrderNo() {
    std::string s;
    do s = "20" + Pad(20 + static_cast<int>(Below(6)), 2) + Pad(1 + static_cast<int>(Below(12)), 2) +
               Pad(1 + static_cast<int>(Below(28)), 2) + Digits(8);
    while (LuhnValid(s));
    return s;
  }
  std::string Timestamp() {
    return "20" + Pad(20 + static_cast<int>(Below(6)), 2) + Pad(1 + static_cast<int>(Below(12)), 2) +
           Pad(1 + static_cast<int>(Below(28)), 2) + Pad(static_cast<int>(Below(24)), 2) +
           Pad(static_cast<int>(Below(60)), 2) + Pad(static_cast<int>(Below(60)), 2);
  }
  std::string Amount() {
    std::string n = Num(1, 999) + "," + Pad(static_cast<int>(Below(1000)), 3);
    if (Chance(0.4f)) n += "," + Pad(static_cast<int>(Below(1000)), 3);
    return (ZhText() ? "¥" : "$") + n + "." + Pad(static_cast<int>(Below(100)), 2);
  }

  Value Slot(const std::string& name) {
    using E = EntityType;
    if (name == "PER") return {Zh() ? PersonZh() : PersonEn(), E::kPerson};
    if (name == "PERZ") return {PersonZh(), E::kPerson};
    if (name == "PERE") return {PersonEn(), E::kPerson};
    if (name == "ADDR") return {Zh() ? AddressZh() : AddressEn(), E::kAddress};
    if (name == "ORG") return {Zh() ? OrgZh() : OrgEn(), E::kOrg};
    if (name == "ID") return {Obfuscate(ResidentId()), E::kResidentId};
    if (name == "PHONE") return {Obfuscate(Phone()), E::kPhone};
    if (name == "CARD") return {Obfuscate(Card()), E::kBankCard};
    if (name == "EMAIL") return {Email(), E::kEmail};
    if (name == "URL") return {Url(), E::kUrl};
    if (name == "IP") return {Ip(), E::kIp};
    if (name == "PASSPORT") return {Passport(), E::kPassport};
    if (name == "PLATE") return {Plate(), E::kPlate};
    if (name == "CREDIT") return {CreditCode(), E::kCreditCode};
    if (name == "SSN") return {Ssn(), E::kSsn};
    if (name == "ORDER") return {OrderNo(), E::kBankCard, true};
    if (name == "INVOICE") return {Digits(12), E::kPhone, true};
    if (name == "TRACK") return {std::string(Chance(0.5f) ? "SF" : "YT") + Digits(13), E::kPassport, true};
    if (name == "TS") return {Timestamp(), E::kPhone, true};
    if (name == "AMOUNT") return {Amount(), E::kBankCard, true};
    if (name == "BADID") return {BadResidentId(), E::kResidentId, true};
    // Plain text.
    if (name == "TITLE") return Plain(Pick(std::vector<std::string>{"经理", "先生", "女士", "总监", "主任", "老师", ""}));
    if (name == "MR") return Plain(Pick(std::vector<std::string>{"Mr. ", "Ms. ", "Dr. ", "Mrs. ", ""}));
    if (name == "N") return Plain(Num(2, 98));
    if (name == "WEEK") return Plain(Num(1, 52));
    if (name == "DATE") return Plain("2023-" + Pad(1 + static_cast<int>(Below(12)), 2) + "-" + Pad(1 + static_cast<int>(Below(28)), 2));
    if (name == "TIME") return Plain(Pad(static_cast<int>(Below(24)), 2) + ":" + Pad(static_cast<int>(Below(60)), 2));
    if (name == "REGION") return Plain(ZhText() ? Pick(std::vector<std::string>{"华南区", "华东区", "华北区", "西南区", "华中区"})
                                           : Pick(std::vector<std::string>{"South", "East", "North", "West", "Central"}));
    if (name == "PCT") return Plain(Num(1, 60) + "." + Num(0, 9) + "%");
    return Plain("{" + name + "}");
  }

  // "{SLOT}" is replaced by a slot's value; "{A|B}" picks one of the literal alternatives.
  void Expand(const std::string& t) {
    size_t i = 0;
    while (i < t.size()) {
      if (t[i] != '{') {
        const size_t j = t.find('{', i);
        Append(t.substr(i, j == std::string::npos ? std::string::npos : j - i));
        i = j == std::string::npos ? t.size() : j;
        continue;
      }
      const size_t j = t.find('}', i);
      const std::string name = t.substr(i + 1, j - i - 1);
      i = j + 1;
      if (name.find('|') != std::string::npos) {
        std::vector<std::string> alts;
        std::stringstream ss(name);
        for (std::string a; std::getline(ss, a, '|');) alts.push_back(a);
        Append(Pick(alts));
        continue;
      }
      Value v = Slot(name);
      const int64_t start = cp_;
      Append(v.text);
      if (v.type) (v.decoy ? decoys_ : spans_).push_back(Span{start, cp_, *v.type, 1.0f});
    }
  }
  void Append(const std::string& s) {
    text_ += s;
    cp_ += CodePoints(s);
  }

  std::vector<std::string> Templates(const std::string& kind) {
    const bool zh = lang_ != "en";
    std::vector<std::string> body, out;
    int lines = 3 + static_cast<int>(Below(4));
    if (kind == "report") {
      out.push_back(zh ? "{REGION}第{WEEK}周工作周报\n汇报人：{PER}{TITLE}（{PHONE}）\n"
                       : "{REGION} Region Weekly Report, week {WEEK}\nPrepared by {MR}{PER} ({PHONE})\n");
      body = zh ? std::vector<std::string>{
                      "本周拜访客户{ORG}，对接人{PER}{TITLE}，联系电话{PHONE}。\n",
                      "{ORG}（统一社会信用代码：{CREDIT}）完成签约，合同金额{AMOUNT}。\n",
                      "客户地址：{ADDR}，收件人{PER}。\n",
                      "订单号{ORDER}已发货，物流单号{TRACK}，预计{DATE}送达。\n",
                      "销售额环比增长{PCT}，回款{AMOUNT}，开票号码{INVOICE}。\n",
                      "{PER}负责的{ORG}项目进入验收，现场地址为{ADDR}。\n",
                      "新增合作伙伴{ORG}，法人代表{PER}，身份证号{ID}。\n",
                      "系统导出时间{TS}，核对记录号{BADID}无误。\n",
                      "下周计划：与{ORG}的{PER}{TITLE}商谈续约，邮件{EMAIL}。\n",
                      "外勤车辆{PLATE}本周行驶{N}0公里，驾驶员{PER}。\n",
                      "上周和{PER}一起去了{ADDR}，见了{ORG}的负责人。\n",
                      "据{PER}反馈，{ORG}准备在{ADDR}开设新门店。\n",
                      "请各位注意，{PER}已调往{ORG}，新的办公地点是{ADDR}。\n",
                      "{ORG}和{ORG}本周都在{REGION}加大了投入。\n"}
                : std::vector<std::string>{
                      "Met {MR}{PER} of {ORG} on {DATE}; call back at {PHONE}.\n",
                      "{ORG} signed the renewal worth {AMOUNT}; billing address {ADDR}.\n",
                      "Order {ORDER} shipped with tracking number {TRACK}.\n",
                      "Revenue grew {PCT} week over week; invoice {INVOICE} was issued.\n",
                      "{PER} is leading the rollout at {ORG}, site address {ADDR}.\n",
                      "New partner {ORG}, contact {PER} <{EMAIL}>.\n",
                      "Export generated at {TS}; reference {BADID} checked.\n",
                      "Next week: review the contract with {PER} at {ORG}.\n",
                      "Please send the samples to {PER} at {ADDR} by Friday.\n",
                      "I spoke with {PER} yesterday; {ORG} wants a quote before {DATE}.\n",
                      "According to {PER}, {ORG} is opening a new office at {ADDR}.\n",
                      "Both {ORG} and {ORG} asked for a discount this week.\n"};
      out.push_back("{BODY}");
      out.push_back(zh ? "报告人：{PER}  {DATE}\n" : "Regards,\n{PER}\n");
    } else if (kind == "email") {
      out.push_back(zh ? "发件人：{PER} <{EMAIL}>\n收件人：{PER} <{EMAIL}>\n主题：{ORG}合同资料\n\n{PER}{TITLE}，您好：\n"
                       : "From: {PER} <{EMAIL}>\nTo: {PER} <{EMAIL}>\nSubject: documents for {ORG}\n\nDear {MR}{PER},\n");
      body = zh ? std::vector<std::string>{
                      "附件是{ORG}的营业执照，统一社会信用代码{CREDIT}。\n",
                      "请将款项汇至{ORG}，账号{CARD}，户名{PER}。\n",
                      "合同寄送地址：{ADDR}，联系人{PER}，电话{PHONE}。\n",
                      "订单{ORDER}的发票号码为{INVOICE}，金额{AMOUNT}。\n",
                      "在线签署链接：{URL}，请于{DATE}前完成。\n",
                      "出差人员{PER}护照号{PASSPORT}，身份证{ID}。\n",
                      "登录异常来自IP {IP}，时间戳{TS}。\n",
                      "如有疑问请联系{PER}，手机{PHONE}。\n",
                      "感谢您上周在{ADDR}的接待，{PER}让我转达{ORG}的问候。\n",
                      "我们已和{ORG}的{PER}确认，样品会寄到{ADDR}。\n"}
                : std::vector<std::string>{
                      "Please wire the deposit to {ORG}, card {CARD}, holder {PER}.\n",
                      "Ship the samples to {ADDR}, attention {PER}, phone {PHONE}.\n",
                      "Order {ORDER}, invoice {INVOICE}, total {AMOUNT}.\n",
                      "Sign online at {URL} before {DATE}.\n",
                      "Traveller {PER}, passport {PASSPORT}, SSN {SSN}.\n",
                      "The login came from {IP} at {TS}.\n",
                      "Questions? Call {PER} at {PHONE} or write to {EMAIL}.\n",
                      "{ORG} has moved to {ADDR}.\n",
                      "Thanks for hosting us at {ADDR} last week; {PER} sends regards from {ORG}.\n",
                      "We confirmed with {PER} of {ORG} that the parcel goes to {ADDR}.\n"};
      out.push_back("{BODY}");
      out.push_back(zh ? "\n此致\n{PER}\n{ORG}\n{ADDR}\n" : "\nBest regards,\n{PER}\n{ORG}\n{ADDR}\n");
    } else if (kind == "table") {
      if (Chance(0.5f)) {
        out.push_back(zh ? "| 姓名 | 身份证号 | 手机 | 地址 | 单位 |\n|---|---|---|---|---|\n"
                         : "| Name | SSN | Phone | Address | Company |\n|---|---|---|---|---|\n");
        body = {zh ? "| {PER} | {ID} | {PHONE} | {ADDR} | {ORG} |\n" : "| {PER} | {SSN} | {PHONE} | {ADDR} | {ORG} |\n",
                zh ? "| {PER} | {BADID} | {PHONE} | {ADDR} | {ORG} |\n" : "| {PER} | {SSN} | {PHONE} | {ADDR} | {ORG} |\n"};
      } else {
        out.push_back(zh ? "姓名,订单号,银行卡,邮箱,车牌,下单时间\n" : "name,order,card,email,ip,created\n");
        body = {zh ? "{PER},{ORDER},{CARD},{EMAIL},{PLATE},{TS}\n" : "{PER},{ORDER},{CARD},{EMAIL},{IP},{TS}\n"};
      }
      out.push_back("{BODY}");
    } else if (kind == "chat") {
      body = zh ? std::vector<std::string>{
                      "[{TIME}] {PER}: 我的手机号是{PHONE}，麻烦尽快回电\n",
                      "[{TIME}] {PER}: 收货地址改成{ADDR}\n",
                      "[{TIME}] {PER}: 订单号{ORDER}，一直没发货\n",
                      "[{TIME}] {PER}: 卡号{CARD}，退款打到这张卡\n",
                      "[{TIME}] {PER}: 我是{ORG}的，找{PER}{TITLE}\n",
                      "[{TIME}] {PER}: 身份证{ID}，车牌{PLATE}\n",
                      "[{TIME}] {PER}: 好的，金额{AMOUNT}没问题\n",
                      "[{TIME}] {PER}: 链接发你了 {URL}\n",
                      "[{TIME}] {PER}: 刚和{PER}通了电话，他说{ORG}那边没问题\n",
                      "[{TIME}] {PER}: 我下午去{ADDR}，你让{PER}在楼下等我\n"}
                : std::vector<std::string>{
                      "[{TIME}] {PER}: my number is {PHONE}, please call back\n",
                      "[{TIME}] {PER}: change the delivery address to {ADDR}\n",
                      "[{TIME}] {PER}: order {ORDER} still has not shipped\n",
                      "[{TIME}] {PER}: refund to card {CARD} please\n",
                      "[{TIME}] {PER}: I'm with {ORG}, looking for {PER}\n",
                      "[{TIME}] {PER}: ok, {AMOUNT} is fine\n",
                      "[{TIME}] {PER}: here is the link {URL}\n",
                      "[{TIME}] {PER}: just talked to {PER}, {ORG} is fine with it\n",
                      "[{TIME}] {PER}: heading to {ADDR} this afternoon, ask {PER} to wait downstairs\n"};
      out.push_back("{BODY}");
    } else {  // ticket
      out.push_back(zh ? "工单编号：TK-{N}{N}{N}\n客户：{PER}（{ORG}）\n联系方式：{PHONE} / {EMAIL}\n问题描述：\n"
                       : "Ticket TK-{N}{N}{N}\nCustomer: {PER} ({ORG})\nContact: {PHONE} / {EMAIL}\nDescription:\n");
      body = zh ? std::vector<std::string>{
                      "用户反映服务器{IP}无法访问，报错时间{TS}。\n",
                      "需要上门维修，地址{ADDR}，预约{DATE}。\n",
                      "客户订单{ORDER}扣款{AMOUNT}两次，银行卡{CARD}。\n",
                      "核验身份：身份证{ID}，另一记录{BADID}校验失败。\n",
                      "转交{ORG}的{PER}处理，回访电话{PHONE}。\n",
                      "附件下载地址{URL}。\n"}
                : std::vector<std::string>{
                      "Server {IP} unreachable since {TS}.\n",
                      "On-site visit needed at {ADDR} on {DATE}.\n",
                      "Order {ORDER} charged {AMOUNT} twice on card {CARD}.\n",
                      "Identity check: SSN {SSN}, passport {PASSPORT}.\n",
                      "Escalated to {PER} at {ORG}, callback {PHONE}.\n",
                      "Logs at {URL}.\n"};
      out.push_back("{BODY}");
      out.push_back(zh ? "处理人：{PER}\n" : "Assignee: {PER}\n");
    }
    std::vector<std::string> expanded;
    for (const std::string& t : out) {
      if (t != "{BODY}") {
        expanded.push_back(t);
        continue;
      }
      for (int k = 0; k < lines; ++k) expanded.push_back(Pick(body));
    }
    return expanded;
  }

  Rng rng_;
  const std::map<std::string, std::vector<std::string>>& lex_;
  std::string lang_;
  std::string text_;
  int64_t cp_ = 0;
  std::vector<Span> spans_, decoys_;
};

nlohmann::json SpansJson(const std::vector<Span>& v) {
  nlohmann::json a = nlohmann::json::array();
  for (const Span& s : v) a.push_back({{"start", s.start}, {"end", s.end}, {"type", EntityTypeName(s.type)}});
  return a;
}

Result<std::vector<Span>> SpansFromJson(const nlohmann::json& j, const char* key, int64_t len) {
  std::vector<Span> out;
  if (!j.contains(key)) return out;
  if (!j[key].is_array()) return Status::Error(std::string("\"") + key + "\" is not an array");
  for (const auto& e : j[key]) {
    if (!e.is_object() || !e.contains("start") || !e.contains("end") || !e.contains("type") ||
        !e["start"].is_number_integer() || !e["end"].is_number_integer() || !e["type"].is_string())
      return Status::Error(std::string("a span of \"") + key + "\" is not {start, end, type}");
    Span s;
    s.start = e["start"].get<int64_t>();
    s.end = e["end"].get<int64_t>();
    std::optional<EntityType> t = ParseEntityType(e["type"].get<std::string>());
    if (!t) return Status::Error("unknown entity type \"" + e["type"].get<std::string>() + "\"");
    s.type = *t;
    if (s.start < 0 || s.end <= s.start || s.end > len)
      return Status::Error("span [" + std::to_string(s.start) + ", " + std::to_string(s.end) +
                           ") lies outside the text of " + std::to_string(len) + " code points");
    out.push_back(s);
  }
  return out;
}

}  // namespace

const char* SplitName(Split s) { return s == Split::kTrain ? "train" : "held-out"; }

std::optional<Split> ParseSplit(std::string_view s) {
  if (s == "train") return Split::kTrain;
  if (s == "held-out" || s == "heldout" || s == "held_out") return Split::kHeldOut;
  return std::nullopt;
}

std::vector<std::string> LexiconCategories() {
  std::vector<std::string> out;
  for (const Category& c : AllLexicons()) out.push_back(c.name);
  return out;
}

std::vector<std::string> LexiconEntries(std::string_view category, Split split) {
  const auto& part = Lexicons().part[split == Split::kHeldOut ? 1 : 0];
  auto it = part.find(std::string(category));
  return it == part.end() ? std::vector<std::string>{} : it->second;
}

LabelledDoc GenerateDoc(uint64_t seed, Split split, int64_t index) {
  LabelledDoc d = Generator(seed, split, index).Make();
  d.id = std::string(SplitName(split)) + "-" + std::to_string(seed) + "-" + std::to_string(index);
  return d;
}

std::vector<LabelledDoc> GenerateCorpus(uint64_t seed, Split split, int64_t count) {
  std::vector<LabelledDoc> docs;
  docs.reserve(static_cast<size_t>(std::max<int64_t>(count, 0)));
  for (int64_t i = 0; i < count; ++i) docs.push_back(GenerateDoc(seed, split, i));
  return docs;
}

std::vector<LabelledDoc> PlainTextDocs(const std::vector<std::string>& texts, Split split, int64_t count,
                                       uint64_t seed) {
  std::vector<LabelledDoc> pieces;
  for (const std::string& t : texts) {
    const std::u32string cps = DecodeUtf8(t);
    size_t a = 0;
    while (a < cps.size()) {
      size_t b = std::min(cps.size(), a + 400);
      // Cut after the last line end between 40 and 400 code points in.
      for (size_t k = b; k > a + 40; --k)
        if (cps[k - 1] == U'\n') {
          b = k;
          break;
        }
      std::u32string piece = cps.substr(a, b - a);
      a = b;
      while (!piece.empty() && (piece.back() == U'\n' || piece.back() == U' ')) piece.pop_back();
      if (piece.size() < 40) continue;
      // Leave out pieces that likely hold a name (an attribution "--", two
      // capitalised words in a row, an author line): unlabelled, they would
      // teach the tagger that names are nothing.
      bool named = false;
      for (size_t k = 0; k + 1 < piece.size() && !named; ++k) {
        if (piece[k] == U'-' && piece[k + 1] == U'-') named = true;
        if (piece[k] >= U'A' && piece[k] <= U'Z' && k + 1 < piece.size() && piece[k + 1] >= U'a' && piece[k + 1] <= U'z') {
          size_t e = k + 1;
          while (e < piece.size() && piece[e] >= U'a' && piece[e] <= U'z') ++e;
          if (e + 1 < piece.size() && piece[e] == U' ' && piece[e + 1] >= U'A' && piece[e + 1] <= U'Z') named = true;
        }
      }
      if (named) continue;
      LabelledDoc d;
      d.text = EncodeUtf8(piece);
      const bool held_out = Checksum64(d.text) % 8 == 0;
      if (held_out != (split == Split::kHeldOut)) continue;
      d.kind = "plain";
      d.lang = "plain";
      pieces.push_back(std::move(d));
    }
  }
  // A seeded order, then the first `count`.
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = pieces.size(); i > 1; --i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::swap(pieces[i - 1], pieces[x % i]);
  }
  if (static_cast<int64_t>(pieces.size()) > count) pieces.resize(static_cast<size_t>(std::max<int64_t>(count, 0)));
  for (size_t i = 0; i < pieces.size(); ++i) pieces[i].id = std::string("plain-") + SplitName(split) + "-" + std::to_string(i);
  return pieces;
}

std::string SpanText(std::string_view text, const Span& s) {
  const std::u32string cps = DecodeUtf8(text);
  const int64_t a = std::clamp<int64_t>(s.start, 0, static_cast<int64_t>(cps.size()));
  const int64_t b = std::clamp<int64_t>(s.end, a, static_cast<int64_t>(cps.size()));
  return EncodeUtf8(std::u32string_view(cps).substr(a, b - a));
}

std::string DocToJsonLine(const LabelledDoc& d) {
  nlohmann::json j = {{"id", d.id},   {"kind", d.kind},           {"lang", d.lang},
                      {"text", d.text}, {"spans", SpansJson(d.spans)}, {"decoys", SpansJson(d.decoys)}};
  return j.dump();
}

Result<LabelledDoc> DocFromJsonLine(std::string_view line) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::Error("not a JSON object");
  if (!j.contains("text") || !j["text"].is_string()) return Status::Error("no \"text\" string");
  LabelledDoc d;
  d.text = j["text"].get<std::string>();
  for (auto [key, field] : {std::pair{"id", &d.id}, {"kind", &d.kind}, {"lang", &d.lang}})
    if (j.contains(key) && j[key].is_string()) *field = j[key].get<std::string>();
  const int64_t len = static_cast<int64_t>(DecodeUtf8(d.text).size());
  ASSIGN_OR_RETURN(d.spans, SpansFromJson(j, "spans", len));
  ASSIGN_OR_RETURN(d.decoys, SpansFromJson(j, "decoys", len));
  return d;
}

Status WriteJsonl(const std::string& path, const std::vector<LabelledDoc>& docs) {
  std::string all;
  for (const LabelledDoc& d : docs) all += DocToJsonLine(d) + "\n";
  return WriteFileAtomic(Env::Default(), path, all);
}

Result<std::vector<LabelledDoc>> ReadJsonl(const std::string& path) {
  ASSIGN_OR_RETURN(std::string data, Env::Default()->ReadFile(path));
  std::vector<LabelledDoc> docs;
  std::istringstream in(data);
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Result<LabelledDoc> d = DocFromJsonLine(line);
    if (!d.ok()) return d.status().With(path + ":" + std::to_string(n));
    docs.push_back(std::move(d).value());
  }
  return docs;
}

}  // namespace myriad::edge
